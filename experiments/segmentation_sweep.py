r"""How many tokens per group each segmentation strategy / threshold gives on a prepared dataset.

    python -m experiments.segmentation_sweep --data_dir runs/smollm2/data --name smollm2_sft \
        --model hamburger_jax.recipes.smollm2:load_base --num_examples 256

Scores the responses of a prepared dataset once with the base model (the entropy of the
distribution that predicts each token, as `data.prepare` does), then groups them under every
strategy / threshold of the sweep. Per setting: tokens per group (the ceiling of the decode
speed-up), the share of each group size, and the mean entropy of tokens that join a group
(how hard the micro decoder's later steps are). Prints JSON and a table; writes the JSON with "provenance" to --out (default
docs/results/data/training/segmentation_sweep.json).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from benchmarks.common import markdown_table, results_dir, write_json
from hamburger_jax.data import builder
from hamburger_jax.data.prepare import load_model
from hamburger_jax.data.strategies import SegmentationConfig, group_sizes
from hamburger_jax.model.scoring import Scorer

SWEEP = (
    SegmentationConfig("decreasing_v2"),                                   # original setting
    SegmentationConfig("decreasing_v2", min_value=0.2),
    SegmentationConfig("decreasing_v2", min_value=0.5),
    SegmentationConfig("decreasing_v2", min_value=0.5, ratio=0.5),
    SegmentationConfig("decreasing_v2", min_value=1.0),
    SegmentationConfig("decreasing_v2", min_value=1.0, ratio=0.5),
    SegmentationConfig("decreasing"),
    SegmentationConfig("sliding", threshold_p=0.9),
    SegmentationConfig("sliding", threshold_p=0.8),
    SegmentationConfig("sliding"),                                         # H(0.7)
    SegmentationConfig("small_group"),                                     # H(0.95)
)


def describe(cfg: SegmentationConfig) -> str:
  if cfg.strategy in ("decreasing_v2", "decreasing"):
    extra = f"min={cfg.min_value:g} " if cfg.strategy == "decreasing_v2" else ""
    return f"{cfg.strategy} {extra}ratio={cfg.ratio:g}"
  return f"{cfg.strategy} p={cfg.threshold_p or {'sliding': 0.7, 'small_group': 0.95}[cfg.strategy]:g}"


def sweep(values: list[np.ndarray], vocab_size: int, max_steps: int = 4) -> list[dict]:
  """values: per-response entropies -> one row per setting of SWEEP."""
  rows = []
  for cfg in SWEEP:
    sizes, joined = [], []
    for v in values:
      s = group_sizes(v, cfg, vocab_size)
      sizes.append(s)
      starts = np.zeros(len(v), bool)
      starts[np.cumsum(s)[:-1]] = True
      starts[0] = True
      joined.append(v[~starts])
    s = np.concatenate(sizes)
    j = np.concatenate(joined)
    rows.append({"setting": describe(cfg), "tokens_per_group": float(s.mean()),
                 "size_share": [float(np.mean(s == k)) for k in range(1, max_steps + 1)],
                 "joined_mean_entropy": float(j.mean()) if j.size else 0.0,
                 "threshold": cfg.resolved_threshold(vocab_size)})
  return rows


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--data_dir", required=True)
  p.add_argument("--name", required=True)
  p.add_argument("--model", required=True, help="MODULE:FUNCTION returning (LlamaConfig, params), "
                 "or random:PRESET")
  p.add_argument("--num_examples", type=int, default=256)
  p.add_argument("--out", default=os.path.join(results_dir("training"), "segmentation_sweep.json"),
                 help="the JSON ('' = print only)")
  a = p.parse_args(argv)
  if a.num_examples < 1:
    p.error(f"--num_examples must be >= 1, got {a.num_examples}.")
  src = builder.data_source(a.data_dir, a.name)
  n = min(a.num_examples, len(src))
  records = [src[i] for i in range(n)]
  vocab = int(max(np.max(r["tokens"]) for r in records)) + 1
  cfg, params = load_model(a.model, None, vocab)
  t0 = time.time()
  seqs = [np.asarray(r["tokens"], np.int32) for r in records]
  scored = Scorer(cfg, params, max_length=max(len(s) for s in seqs)).score(seqs)
  values = [v[int(r["prompt_length"]):].astype(np.float64) for v, r in zip(scored, records)]
  out = {"examples": n, "response_tokens": int(sum(len(v) for v in values)),
         "score_s": time.time() - t0, "mean_entropy": float(np.mean(np.concatenate(values))),
         "rows": sweep(values, cfg.vocab_size)}
  write_json(out, a.out, __spec__.name, argv)
  print(json.dumps(out, indent=1))
  print(f"\n{n} examples, {out['response_tokens']} response tokens, "
        f"mean entropy {out['mean_entropy']:.3f} nats")
  print(markdown_table(
      ["setting", "tokens/group", "size 1/2/3/4", "mean entropy of joined tokens"],
      [[r["setting"], f"{r['tokens_per_group']:.3f}", "/".join(f"{x:.2f}" for x in r["size_share"]),
        f"{r['joined_mean_entropy']:.3f}"] for r in out["rows"]]))
  return out


if __name__ == "__main__":
  main()
