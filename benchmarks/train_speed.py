r"""HAMburger train step vs base-LM train step on the same tokens and base model, in one run.

    python -m benchmarks.train_speed --config configs/tiny.py --steps 20
    python -m benchmarks.train_speed --config configs/llama3_1b.py --config.data.batch_size=16

One set of synthetic examples (prompt, response, group sizes) is packed twice: merged groups for
HAMburger (fewer macro positions, so fewer rows) and size-1 groups for the base LM. Both steps are
the real jitted train steps of `hamburger_jax.train.setup.Setup` (donated state, same optimizer). Prints a table and one
JSON line: step times, response tokens per second, and the ratios; writes the JSON with
"provenance" to --out (default docs/results/data/training/train_speed.json).
"""

import json
import os
import sys
import time

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from benchmarks.common import markdown_table, results_dir, write_json
from hamburger_jax.model.batch import example_to_macro, first_fit, pack_rows
from hamburger_jax.train import batches, sharding
from hamburger_jax.train.run_config import model_config
from hamburger_jax.train.setup import Setup

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "configs/tiny.py", "Experiment config file.",
                                lock_config=True)
flags.DEFINE_integer("steps", 20, "Timed steps per mode (after 2 warm-up steps).")
flags.DEFINE_string("out", os.path.join(results_dir("training"), "train_speed.json"),
                    "the JSON ('' = print only)")


def make_examples(config, cfg, rows: int):
  """Synthetic examples that fill `rows` rows of the base-LM batch."""
  gen = batches.SyntheticIterator(cfg, config.data.seq_len, rows, config.data.prompt_len,
                                     config.data.response_len, config.seed, "train", False,
                                     slice(None))
  rng, examples = np.random.default_rng(config.seed), []
  while True:
    ex = gen._example(rng)  # pylint: disable=protected-access
    lengths = [len(p) + len(r) - 1 for p, r, _ in examples + [ex]]
    if len(first_fit(lengths, config.data.seq_len)) > rows:
      return examples
    examples.append(ex)


def pack(examples, seq_len: int, max_steps: int, merged: bool, multiple: int):
  """Packs examples (merged groups or size-1 groups) into rows padded to a multiple."""
  macros = [example_to_macro(p, r, s if merged else [1] * len(r), max_steps)
            for p, r, s in examples]
  rows = first_fit([len(m["group_lengths"]) for m in macros], seq_len)
  num_rows = -(-len(rows) // multiple) * multiple
  return pack_rows(macros, rows, seq_len, max_steps, num_rows)


def time_steps(config, cfg, mesh, batch, steps: int) -> dict:
  """Compiles and times the train step of `config.mode` on one fixed batch."""
  config.data.batch_size = batch["segment_ids"].shape[0]
  setup = Setup(config, cfg, mesh)
  state = setup.init_state()
  device_batch = batches.to_device(batch, setup.data_sharding)
  t0 = time.perf_counter()
  for _ in range(2):
    state, metrics = setup.train_step(state, device_batch)
  jax.block_until_ready(metrics)
  warmup = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(steps):
    state, metrics = setup.train_step(state, device_batch)
  jax.block_until_ready(metrics)
  step_s = (time.perf_counter() - t0) / steps
  tokens = float(metrics["tokens"])
  return {"rows": int(batch["segment_ids"].shape[0]), "macro_positions": int(
      np.count_nonzero(batch["segment_ids"])), "tokens_per_step": tokens,
          "step_ms": 1e3 * step_s, "tokens_per_sec": tokens / step_s,
          "compile_and_warmup_s": warmup, "loss": float(metrics["loss"])}


def main(argv):
  del argv
  config = FLAGS.config
  config.optim.grad_accum_steps = 1
  mesh = sharding.make_mesh(config.mesh)
  cfg = model_config(config)
  multiple = sharding.batch_shards(mesh)
  examples = make_examples(config, cfg, config.data.batch_size)
  results = {}
  for mode in ("hamburger", "base_lm"):
    c = config.copy_and_resolve_references()
    c.mode = mode
    mode_cfg = model_config(c)
    batch = pack(examples, c.data.seq_len, cfg.max_steps, mode == "hamburger", multiple)
    results[mode] = time_steps(c, mode_cfg, mesh, batch, FLAGS.steps)
  h, b = results["hamburger"], results["base_lm"]
  assert h["tokens_per_step"] == b["tokens_per_step"], "both modes must learn the same tokens"
  out = {"device": str(jax.devices()[0].device_kind), "num_devices": jax.device_count(),
         "examples": len(examples), "model": {"preset": config.model.preset,
                                              "num_layers": cfg.base.num_layers,
                                              "hidden_size": cfg.base.hidden_size},
         **results, "step_time_ratio_hamburger_over_base": h["step_ms"] / b["step_ms"],
         "tokens_per_sec_ratio_hamburger_over_base": h["tokens_per_sec"] / b["tokens_per_sec"]}
  print(markdown_table(["mode", "rows", "positions", "tokens", "step ms", "tokens/s"], [
      [mode, r["rows"], r["macro_positions"], f"{r['tokens_per_step']:.0f}", f"{r['step_ms']:.2f}",
       f"{r['tokens_per_sec']:.0f}"] for mode, r in results.items()]))
  print(f"step-time ratio (hamburger / base): {out['step_time_ratio_hamburger_over_base']:.3f}")
  write_json(out, FLAGS.out, __spec__.name)
  print(json.dumps(out))
  sys.stdout.flush()


def run() -> None:
  """app.run(main); --help prints the flags and exits 0 (absl's own --help exits 1)."""
  if {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__ + "\n" + FLAGS.main_module_help())
    sys.exit(0)
  app.run(main)


if __name__ == "__main__":
  run()
