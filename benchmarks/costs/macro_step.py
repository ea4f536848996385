"""`--what macro_step`: what one macro step of the continuous batcher costs with B running rows:
the base model against HAMburger at confidence 1 (no micro steps: embedder, merge adapter, stop
head, bookkeeping) and at the shipped defaults, each with the merge adapter skipped when no row
is merged and computed always. Shipped HAMburger-SmolLM2, held-out prompts, greedy, rows that
never finish.

Every round gives each setting's B slots the next B held-out prompts (the same for every setting)
and times its second chunk of `--chunk_steps` macro steps; the settings are timed in rotation,
`--repeats` rounds (median), so a slow phase of the machine hits every setting alike.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.common import machine, markdown_table
from hamburger_jax.decode.batching import ContinuousBatcher, Request
from hamburger_jax.shipped import smollm2
from hamburger_jax.recipes.heldout import heldout_prompts

NEVER = -1        # an EOS id no token has: rows run until the chunk ends


def settings(defaults: dict):
  """name -> (base, confidence, min_token_prob, skip_unmerged)."""
  conf, mtp = defaults["confidence"], defaults["min_token_prob"]
  return {"base": (True, 1.0, 0.0, None),
          "hamburger confidence 1, merge work skipped when unmerged": (False, 1.0, 0.0, True),
          "hamburger confidence 1, merge work always": (False, 1.0, 0.0, False),
          "hamburger defaults, merge work skipped when unmerged": (False, conf, mtp, True),
          "hamburger defaults, merge work always": (False, conf, mtp, False)}


def _timed_round(name, bt, spec, running, batch, chunk_steps):
  """Refills bt's slots with `batch`, runs one untimed chunk, then -> (seconds of the next chunk,
  tokens it gave)."""
  _, conf, mtp, _ = spec
  for rid in running[name]:
    bt.cancel(rid)
  running[name] = [bt.submit(Request(p, max_new_tokens=1 << 20, confidence=conf,
                                     min_token_prob=mtp)) for p in batch]
  bt.step()
  t0 = time.perf_counter()
  events = bt.step()
  elapsed = time.perf_counter() - t0
  if len(events) != len(batch) or any(e.finished for e in events):
    raise RuntimeError(f"{name}: a row finished early; raise the cache length.")
  return elapsed, sum(len(e.new_tokens) for e in events)


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
      elapsed, new = _timed_round(name, bt, specs[name], running, batch, chunk_steps)
      if r:
        ms[name].append(elapsed * 1e3 / chunk_steps)
        tokens[name] += new
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


def measure(args) -> tuple[dict, str]:
  """-> (result JSON, markdown table) over args.batch_sizes."""
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
  return result, format_table(rows)
