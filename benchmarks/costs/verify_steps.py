"""`--what verify_steps`: what a whole verified step costs at each width, per batch.

The shipped HAMburger-SmolLM2 with its verification drafter decodes held-out mixed prompts
(greedy, 48 tokens, lookup drafts on) with every step's drafts capped at W - 1 (`max_group` W),
so each loop iteration runs the base forward at width W and drafts W - 1 tokens for the next: the
forward, the drafting and the bookkeeping together. Per batch size b, max(8, 2b) prompts in
static batches of b, the widths timed in rotation; ms per loop iteration is the decode time over
the iterations (the slowest row's steps per batch). Relative to width 1 (no drafts) these are
`hamburger_jax/decode/draft_width.py`'s CPU_COSTS.
"""

from __future__ import annotations

import numpy as np

from benchmarks.common import machine, markdown_table
from hamburger_jax.decode.checkpoint import open_checkpoint
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.recipes.heldout import heldout_prompts

WIDTHS = (1, 2, 4)
MAX_NEW_TOKENS = 48


def _prompts(d, n: int):
  return [d.tokenizer.encode(x["prompt"], chat=True, system=d.system)
          for x in heldout_prompts(n, "both")]


def verify_sampler(d, prompts, **kw) -> Sampler:
  """The shipped model's verified-decoding Sampler with room for prompts + MAX_NEW_TOKENS."""
  cache_length = -(-(max(len(p) for p in prompts) + MAX_NEW_TOKENS) // 64) * 64
  return Sampler(d.config, d.params, draft_vocab=d.draft_vocab, verify=True,
                 cache_length=cache_length, out_length=MAX_NEW_TOKENS, eos_ids=d.eos_ids, **kw)


def _time(sampler, prompts, b: int, width: int) -> tuple[float, int]:
  """-> (decode seconds, loop iterations) over static batches of b."""
  seconds, iterations = 0.0, 0
  for i in range(0, len(prompts), b):
    r = sampler.decode(prompts[i:i + b], max_new_tokens=MAX_NEW_TOKENS, confidence=0.001,
                       min_token_prob=0.0, max_group=width)
    seconds += r.decode_s
    iterations += max(r.macro_steps)
  return seconds, iterations


def measure(args) -> tuple[dict, str]:
  d = open_checkpoint("smollm2", verify=True)
  rows = []
  for b in args.batch_sizes:
    prompts = _prompts(d, max(8, 2 * b))
    sampler = verify_sampler(d, prompts, draft_width_rule=False)
    for w in WIDTHS:                                      # compile and warm up
      _time(sampler, prompts[:b], b, w)
    per_step = {w: [] for w in WIDTHS}
    for _ in range(args.repeats):
      for w in WIDTHS:
        seconds, iterations = _time(sampler, prompts, b, w)
        per_step[w].append(seconds / iterations)
    ms = [float(np.median(per_step[w])) * 1e3 for w in WIDTHS]
    rows.append({"batch": b, "prompts": len(prompts), "widths": list(WIDTHS), "ms": ms,
                 "relative": [m / ms[0] for m in ms]})
  result = {"machine": machine(), "max_new_tokens": MAX_NEW_TOKENS, "repeats": args.repeats,
            "rows": rows}
  table = markdown_table(["batch", "prompts"] + [f"width {w} ms (x width 1)" for w in WIDTHS],
                         [[r["batch"], r["prompts"]] + [f"{m:.1f} ({x:.2f}x)" for m, x in
                                                        zip(r["ms"], r["relative"])]
                          for r in rows])
  return result, table
