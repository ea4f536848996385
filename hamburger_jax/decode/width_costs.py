"""The width rule's costs timed on the machine that decodes: a verified step at each forward width.

The width rule (`decode/draft_width.py`) weighs the tokens a wider verified forward is expected to
commit against what it costs. What a width costs depends on the machine, the model and the batch
(it moves from day to day on one CPU: docs/results/step_costs.md), so `Sampler(.., draft_width_costs="measure")` times them once per
batch bucket with the compiled loop itself: the state's traced `width_costs` force one width at a
time (every other width priced out), the loop runs a few steps from the call's own prompts, and
each width's time per step over width 1's is its cost. No extra compile; drafts are drafted as a
step at that width drafts them (none at width 1, one at width 2, ..).

    costs = measure(start, run, widths)    # start() -> a fresh prefilled state; run(state, limit)
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

# A width priced out of the rule: no expected tokens per cost beat the width being timed.
PRICED_OUT = 1e9
STEPS = 4       # verified steps timed per width and round
ROUNDS = 3      # rounds over the widths (interleaved, the median per width is kept)


def forcing(widths: Sequence[int], width: int) -> tuple:
  """Width costs under which the rule picks `width` whenever a row has drafts for it: its cost 1,
  every other width PRICED_OUT (a tuple of [] f32, the state's `width_costs`)."""
  return as_state_costs([1.0 if w == width else PRICED_OUT for w in widths])


def as_state_costs(costs: Sequence[float]) -> tuple:
  """Relative costs per width -> the state's `width_costs` (a tuple of [] f32)."""
  return tuple(jnp.float32(c) for c in costs)


def resolve(costs, widths: Sequence[int]):
  """A `draft_width_costs` setting as given -> None, "measure", or checked numbers (`check`)."""
  if costs is None or (isinstance(costs, str) and costs == "measure"):
    return costs
  return check(costs, widths)


def check(costs, widths: Sequence[int]) -> tuple[float, ...]:
  """Costs as given (one positive finite number per width) -> a tuple of floats; ValueError
  naming the problem otherwise."""
  try:
    values = tuple(float(c) for c in costs)
  except (TypeError, ValueError):
    raise ValueError(f"draft_width_costs: one relative cost per forward width {tuple(widths)}, "
                     f"or 'measure'; got {costs!r}") from None
  if len(values) != len(widths) or not all(0.0 < c < float("inf") for c in values):
    raise ValueError(f"draft_width_costs: one positive finite cost per forward width "
                     f"{tuple(widths)}, or 'measure'; got {costs!r}")
  return values


def measure(start: Callable, run: Callable, widths: Sequence[int], steps: int = STEPS,
            rounds: int = ROUNDS, clock: Callable[[], float] = time.perf_counter
            ) -> tuple[float, ...]:
  """Each width's time per verified step relative to the first width's.

  start() -> a freshly prefilled decode state (greedy rows that draft freely and never end
  early: the caller's prompts with confidence ~0, no EOS ids), called once (each run starts
  from a copy: the loop donates its state); run(state, step_limit) -> the state after the loop
  ran until `state.iteration == step_limit` (its compiled loop). One step per run is untimed
  (the loop's compile, then a step that drafts: the prefilled rows have no drafts pending); rows
  that finish inside the timed steps are counted by the loop iterations, not assumed.
  """
  prefilled = start()
  per_step = {w: [] for w in widths}
  for _ in range(rounds):
    for w in widths:
      state = jax.tree_util.tree_map(jnp.copy, prefilled).replace(width_costs=forcing(widths, w))
      state = jax.block_until_ready(run(state, 1))
      first = int(state.iteration)
      t0 = clock()
      state = jax.block_until_ready(run(state, first + steps))
      elapsed = clock() - t0
      ran = int(state.iteration) - first
      if ran > 0:
        per_step[w].append(elapsed / ran)
  if not all(per_step.values()):
    return tuple(1.0 for _ in widths)          # every row ended at once: nothing to time
  median = {w: statistics.median(t) for w, t in per_step.items()}
  base = median[widths[0]]
  return tuple(max(median[w] / base, 1e-3) for w in widths)
