r"""What one macro step of the continuous batcher costs with B running rows: the base model against
HAMburger at confidence 1 (no micro steps: embedder, merge adapter, stop head, bookkeeping) and at
the shipped defaults, each with the merge adapter skipped when no row is merged and computed
always. Shipped HAMburger-SmolLM2, held-out prompts, greedy, rows that never finish. One run.

    python benchmarks/macro_step_costs.py                       # B = 1, 8, 32
    python benchmarks/macro_step_costs.py --batch_sizes 8 --repeats 9

Every round gives each setting's B slots the next B held-out prompts (the same for every setting)
and times its second chunk of `--chunk_steps` macro steps; the settings are timed in rotation,
`--repeats` rounds (median), so a slow phase of the machine hits every setting alike. Writes JSON
(--out) and prints a table.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from quality import heldout_prompts  # noqa: E402  pylint: disable=import-error
from report import machine, markdown_table, positive_ints, write_json  # noqa: E402

from hamburger_jax.decode.batching import ContinuousBatcher, Request  # noqa: E402
from hamburger_jax.recipes import smollm2  # noqa: E402

NEVER = -1        # an EOS id no token has: rows run until the chunk ends


def settings(defaults: dict):
  """name -> (base, confidence, min_token_prob, skip_unmerged)."""
  conf, mtp = defaults["confidence"], defaults["min_token_prob"]
  return {"base": (True, 1.0, 0.0, None),
          "hamburger confidence 1, merge work skipped when unmerged": (False, 1.0, 0.0, True),
          "hamburger confidence 1, merge work always": (False, 1.0, 0.0, False),
          "hamburger defaults, merge work skipped when unmerged": (False, conf, mtp, True),
          "hamburger defaults, merge work always": (False, conf, mtp, False)}


def bench(cfg, params, prompts, b: int, repeats: int, chunk_steps: int, defaults: dict):
  """-> rows of one batch size: median ms per macro step and tokens per macro step per setting.

  Every round refills the B slots with the next B prompts (cycling through `prompts`) and runs
  one untimed chunk (admission, and the first macro steps after the prompt) before the timed one.
  """
  cache_length = max(map(len, prompts)) + 2 * chunk_steps + 1
  specs = settings(defaults)
  runs = {name: ContinuousBatcher(cfg, params, base=base, num_slots=b, cache_length=cache_length,
                                  chunk_steps=chunk_steps, eos_ids=(NEVER,),
                                  skip_unmerged=skip)
          for name, (base, _, _, skip) in specs.items()}
  running = {name: [] for name in runs}
  ms = {name: [] for name in runs}
  tokens = dict.fromkeys(runs, 0)
  for r in range(repeats + 1):                    # round 0 compiles, untimed
    batch = [prompts[(r * b + i) % len(prompts)] for i in range(b)]
    for name, bt in runs.items():
      _, conf, mtp, _ = specs[name]
      for rid in running[name]:
        bt.cancel(rid)
      running[name] = [bt.submit(Request(p, max_new_tokens=1 << 20, confidence=conf,
                                         min_token_prob=mtp)) for p in batch]
      bt.step()
      t0 = time.perf_counter()
      events = bt.step()
      elapsed = time.perf_counter() - t0
      if len(events) != b or any(e.finished for e in events):
        raise RuntimeError(f"{name}: a row finished early; raise the cache length.")
      if r:
        ms[name].append(elapsed * 1e3 / chunk_steps)
        tokens[name] += sum(len(e.new_tokens) for e in events)
  rows = []
  base_ms = float(np.median(ms["base"]))
  for name in runs:
    step_ms = float(np.median(ms[name]))
    per_step = tokens[name] / (b * repeats * chunk_steps)
    rows.append({"batch": b, "setting": name, "ms_per_macro_step": step_ms,
                 "tokens_per_row_step": per_step, "ms_per_row_token": step_ms / (b * per_step),
                 "tokens_per_s_vs_base": base_ms / (step_ms / per_step),
                 "ms_all_repeats": [round(x, 2) for x in ms[name]]})
  return rows


def format_table(rows) -> str:
  return markdown_table(
      ["rows B", "setting", "ms per macro step", "tokens per row per step",
       "ms per row-token", "tokens/s vs base"],
      [[r["batch"], r["setting"], f"{r['ms_per_macro_step']:.1f}",
        f"{r['tokens_per_row_step']:.3f}", f"{r['ms_per_row_token']:.2f}",
        f"{r['tokens_per_s_vs_base']:.3f}"] for r in rows])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch_sizes", type=positive_ints, default="1,8,32")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--chunk_steps", type=int, default=4)
  parser.add_argument("--num_prompts", type=int, default=64, help="held-out prompts cycled through")
  parser.add_argument("--asset_dir", default=smollm2.ASSET_DIR)
  parser.add_argument("--out", default="docs/macro_step_costs.json")
  args = parser.parse_args(argv)
  if min(args.repeats, args.chunk_steps, args.num_prompts) < 1:
    parser.error("--repeats, --chunk_steps and --num_prompts must be >= 1.")
  cfg, params, tok, _ = smollm2.load_shipped(args.asset_dir)
  defaults = smollm2.decode_defaults(args.asset_dir)
  prompts = [tok.encode(p["prompt"], chat=True, system=smollm2.SYSTEM_PROMPT)
             for p in heldout_prompts(args.num_prompts)]
  rows = []
  for b in args.batch_sizes:
    rows += bench(cfg, params, prompts, b, args.repeats, args.chunk_steps, defaults)
  result = {"benchmark": "macro_step_costs", "machine": machine(), "decode_defaults": defaults,
            "repeats": args.repeats, "chunk_steps": args.chunk_steps,
            "num_prompts": len(prompts), "rows": rows}
  print(format_table(rows))
  print(json.dumps(result))
  write_json(result, args.out)
  return result


if __name__ == "__main__":
  main()
