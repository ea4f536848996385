"""`--what timed_width_costs`: what timing the width rule's costs at start costs, and how they vary.

The shipped HAMburger-SmolLM2 with its verification drafter and calibrated width rule, per batch
size b: `Sampler(draft_width_costs="measure").width_costs` on b held-out mixed prompts
(`decode/width_costs.py`: one prefill, each width forced in turn for a few steps), first with the
compile, then --repeats times more with the compiled loop (the cache of timed costs cleared
before each): the seconds each took and the costs it timed.
"""

from __future__ import annotations

import statistics
import time

from benchmarks.common import machine, markdown_table
from benchmarks.costs.verify_steps import _prompts, verify_sampler
from hamburger_jax.decode.checkpoint import open_checkpoint


def measure(args) -> tuple[dict, str]:
  d = open_checkpoint("smollm2", verify=True)
  rows = []
  for b in args.batch_sizes:
    prompts = _prompts(d, b)
    sampler = verify_sampler(d, prompts, draft_width_rule=d.draft_width_rule,
                             draft_width_costs="measure")
    t0 = time.perf_counter()
    sampler.width_costs(prompts)
    first_s, seconds, costs = time.perf_counter() - t0, [], []
    for _ in range(args.repeats):
      sampler.measured_width_costs.clear()
      t0 = time.perf_counter()
      costs.append(list(sampler.width_costs(prompts)))
      seconds.append(time.perf_counter() - t0)
    rows.append({"batch": b, "first_s": first_s, "compile_s": sampler.compile_s,
                 "seconds": seconds, "costs": costs})
  result = {"machine": machine(), "repeats": args.repeats, "rows": rows}
  span = lambda xs: f"{min(xs):.2f}-{max(xs):.2f}"
  table = markdown_table(
      ["batch", "first call s (compile s)", "timing s (median)", "width 2 cost", "width 4 cost"],
      [[r["batch"], f"{r['first_s']:.1f} ({r['compile_s']:.1f})",
        f"{statistics.median(r['seconds']):.2f}", span([c[1] for c in r["costs"]]),
        span([c[2] for c in r["costs"]])] for r in rows])
  return result, table
