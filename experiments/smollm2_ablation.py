r"""Equal-budget ablation of HAMburger-SmolLM2: 2 vs 4 micro-decoder layers, frozen vs adapted base
(all of it, or a rank-64 merge adapter that acts only at merged inputs).

    python -m experiments.smollm2_ablation --workdir runs/smollm2 --steps 40

Trains each arm from the same start (SmolLM2 base, the same random grafted init, the same data
order and learning-rate schedule) for `--steps` optimizer steps with configs/smollm2.py, then
reads the held-out evaluation at the last step and the mean seconds per step from each run's
metrics.jsonl. Arms whose run already finished are not retrained (delete their directory to).
Prints JSON and a table; writes the JSON with "provenance" to --out (default
docs/results/data/training/smollm2_ablation.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.common import REPO, markdown_table, results_dir, write_json

ARMS = {
    "2 layers, frozen base": ["--config.model.num_micro_layers=2", "--config.freeze_base=True"],
    "4 layers, frozen base": ["--config.model.num_micro_layers=4", "--config.freeze_base=True"],
    "2 layers, adapted base": ["--config.model.num_micro_layers=2", "--config.freeze_base=False"],
    "2 layers, merge adapter": ["--config.model.num_micro_layers=2", "--config.freeze_base=True",
                                "--config.model.merge_adapter_rank=64"],
}
EVAL_KEYS = ("loss", "label_loss", "stop_loss", "accuracy_s1", "accuracy_s2", "accuracy_s3",
             "accuracy_s4", "stop_accuracy", "expected_tokens_per_step")


def read_metrics(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def summarize(records: list[dict], steps: int) -> dict | None:
  evals = [r for r in records if r["step"] == steps and "eval/loss" in r]
  if not evals:
    return None
  train = [r for r in records if "train/tokens_per_sec" in r]
  times = [r["time"] for r in train]
  per_step = (times[-1] - times[1]) / (train[-1]["step"] - train[1]["step"]) if len(train) > 2 else 0
  out = {k: evals[-1][f"eval/{k}"] for k in EVAL_KEYS}
  out["seconds_per_step"] = per_step
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", default="runs/smollm2")
  p.add_argument("--steps", type=int, default=40)
  p.add_argument("--batch_size", type=int, default=4, help="rows per step (configs/smollm2.py: 8)")
  p.add_argument("--config", default="configs/smollm2.py")
  p.add_argument("--out", default=os.path.join(results_dir("training"), "smollm2_ablation.json"),
                 help="the JSON ('' = print only)")
  a = p.parse_args(argv)
  if a.steps < 1 or a.batch_size < 1:
    p.error(f"--steps and --batch_size must be >= 1, got {a.steps} and {a.batch_size}.")
  results = {}
  for name, flags in ARMS.items():
    run_dir = os.path.join(a.workdir, "ablation", name.replace(", ", "_").replace(" ", "_"))
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if not (os.path.exists(metrics) and summarize(read_metrics(metrics), a.steps)):
      subprocess.run([sys.executable, os.path.join(REPO, "train.py"), f"--config={a.config}", f"--workdir={run_dir}",
                      f"--config.data.data_dir={os.path.join(a.workdir, 'data')}",
                      f"--config.init.checkpoint={os.path.join(a.workdir, 'base_hf')}",
                      f"--config.num_train_steps={a.steps}", f"--config.eval.every_steps={a.steps}",
                      "--config.checkpoint.every_steps=100000",
                      f"--config.data.batch_size={a.batch_size}",
                      # ~16 held-out rows: the whole validation split (32 answers).
                      f"--config.eval.num_batches={-(-16 // a.batch_size)}", *flags], check=True)
    results[name] = summarize(read_metrics(metrics), a.steps)
  out = {"steps": a.steps, "batch_size": a.batch_size, "arms": results}
  write_json(out, a.out, __spec__.name, argv)
  print(json.dumps(out, indent=1))
  print(f"\nHeld-out evaluation after {a.steps} steps of {a.batch_size} rows "
        "(same data, init and schedule):")
  print(markdown_table(
      ["arm", "loss", "acc s1/s2/s3/s4", "stop acc", "E[tokens/step]", "s/step"],
      [[name, f"{r['loss']:.3f}", "/".join(f"{r[f'accuracy_s{i}']:.3f}" for i in range(1, 5)),
        f"{r['stop_accuracy']:.3f}", f"{r['expected_tokens_per_step']:.2f}",
        f"{r['seconds_per_step']:.1f}"] for name, r in results.items()]))
  return out


if __name__ == "__main__":
  main()
