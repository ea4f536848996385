"""How many drafts a verified step sends: the forward width with the most expected tokens per cost.

A verified forward runs at one of the static widths of `verify.forward_widths(S)` (1, 2, 4),
the smallest that holds the batch's longest pending input; a whole step's cost grows with the
width on a CPU, less on a memory-bound accelerator (docs/results/step_costs.md). Each row's drafts come with the stop head's estimate that each is accepted given
the ones before: the stop head's continue-probability (`draft_width_rule=True`; the verification
stop head is trained for exactly that: `train/drafter.py`), or, with a `Calibration` (a
checkpoint's `verify_calibration.json`), the draft's own probability q mapped per draft index to
sigmoid(slope * logit(q) + intercept), fit on answers the drafter never trained on
(`train/acceptance_calibration.py`); looked-up drafts count as sure. The rule picks the width

    w* = argmax_w E(w) / cost(w),   E(w) = sum over running rows r of
                                           1 + sum_{1 <= j < w, j <= k_r} prod_{i <= j} a_{r,i}

(k_r: the row's drafts, a_{r,i}: draft i's acceptance estimate) and sends each row its first
min(k_r, w* - 1) drafts. With equal costs it keeps every draft (the widest width never buys
fewer expected tokens). Drafting stops where the rule would not send the next draft
(`worth_drafting`), so the drafts it would drop are not drafted.

Off unless asked for (`Sampler(.., draft_width_rule=...)`; decode.py and the server's
`--width_rule` pass a checkpoint's calibration). The stop head's estimates rank drafts poorly and
gained nothing on this CPU; the calibrated draft probabilities gained at batch 1, not at batch 8
(docs/results/quality.md). Costs are traced (the state's `width_costs`): by default `costs`, a
CPU's table measured on one machine (on other backends every width costs the same, so the rule
sends every draft); `Sampler(.., draft_width_costs="measure")` times them on the machine that
decodes (`decode/width_costs.py`).

    num_drafts = choose(num_drafts, accept, active, widths, jnp.stack(state.width_costs))
"""

from __future__ import annotations

from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

# A whole verified step (base forward, LM head, drafting and bookkeeping) at widths 1, 2, 4 with
# 0, 1, 3 drafts drafted, relative to width 1, per batch size: the shipped HAMburger-SmolLM2 on
# the 2-core CPU of docs/results/step_costs.md (`python -m benchmarks.step_costs --what
# verify_steps`).
CPU_WIDTHS = (1, 2, 4)
CPU_COSTS = {1: (1.0, 1.38, 1.55), 8: (1.0, 1.39, 2.03), 32: (1.0, 1.56, 2.32)}


# Per draft index j = 1, 2, ..: (slope, intercept) of the estimate sigmoid(slope * logit(q_j) +
# intercept) that draft j is accepted given drafts < j were (q_j: its probability under the
# micro decoder); indices past the last take the last pair. Static: part of the engine.
Calibration = Tuple[Tuple[float, float], ...]


def enabled(engine) -> bool:
  """`engine.draft_width_rule` (None / False: off; see the module docstring)."""
  return bool(engine.draft_width_rule)


def calibration(engine) -> Calibration | None:
  """The engine's draft-probability calibration, or None (off, or the stop head's estimates)."""
  rule = engine.draft_width_rule
  return rule if isinstance(rule, tuple) else None


def calibrated(j: int, logprob, calib: Calibration):
  """Draft j's (a traced or Python int >= 1) acceptance estimate [B] f32 from its log-probability
  logprob [B]."""
  slope, intercept = jnp.asarray(calib, jnp.float32)[jnp.minimum(j, len(calib)) - 1]
  q = jnp.clip(jnp.exp(logprob.astype(jnp.float32)), 1e-6, 1.0 - 1e-6)
  return jax.nn.sigmoid(slope * (jnp.log(q) - jnp.log1p(-q)) + intercept)


def check_calibration(calib) -> Calibration:
  """A calibration as given (a sequence of (slope, intercept) pairs) -> Calibration; ValueError
  naming the problem otherwise."""
  try:
    pairs = tuple((float(a), float(b)) for a, b in calib)
  except (TypeError, ValueError):
    raise ValueError(f"an acceptance calibration is a list of [slope, intercept] pairs, one per "
                     f"draft index; got {calib!r}") from None
  if not pairs or not all(np.isfinite(pairs).all(axis=1)):
    raise ValueError(f"an acceptance calibration needs at least one finite [slope, intercept] "
                     f"pair; got {calib!r}")
  return pairs


def resolve(rule):
  """A `draft_width_rule` as given -> the engine's: None / False / True as they are, a sequence
  of (slope, intercept) pairs as a Calibration (ValueError if malformed)."""
  return rule if rule is None or isinstance(rule, bool) else check_calibration(rule)


def costs(batch: int, widths) -> tuple[float, ...]:
  """The relative cost of each width at this batch size: the measured batch size nearest below
  (or the smallest), interpolated over the widths; 1 for every width off a CPU."""
  if jax.default_backend() != "cpu":
    return tuple(1.0 for _ in widths)
  sizes = sorted(CPU_COSTS)
  near = max([s for s in sizes if s <= batch] or sizes[:1])
  return tuple(float(c) for c in np.interp(widths, CPU_WIDTHS, CPU_COSTS[near]))


def choose(num_drafts, accept, active, widths, width_costs):
  """num_drafts [B] i32, accept [B, S] f32 (index j >= 1: draft j's acceptance given drafts
  < j; index 0 unused), active [B] bool -> the drafts to send [B] i32 (see the module)."""
  s = accept.shape[1]
  reach = jnp.cumprod(accept[:, 1:], axis=1)                     # [B, S-1]: drafts 1..j accepted
  j = jnp.arange(1, s)[None, :]
  sent = (j <= num_drafts[:, None]) & active[:, None]
  expected = jnp.stack([jnp.sum(jnp.where(sent & (j < w), reach, 0.0)) for w in widths])
  expected = expected + jnp.sum(active)
  best = jnp.asarray(widths)[jnp.argmax(expected / jnp.asarray(width_costs, jnp.float32))]
  return jnp.minimum(num_drafts, best - 1)


def worth_drafting(depth, cap, accept, active, widths, width_costs):
  """Whether to draft index `depth` (traced scalar, >= 1) for the batch: the rule would send a
  draft there were the rows' later drafts estimated as their last known one.

  cap [B] i32: the drafts each row may reach (0: none), accept [B, S] f32: the estimates known
  through index `depth` (later columns are ignored), active [B] bool -> bool scalar.
  """
  s = accept.shape[1]
  j = jnp.arange(s)[None, :]
  last = jnp.take_along_axis(accept, jnp.full((accept.shape[0], 1), depth), axis=1)
  extended = jnp.where(j <= depth, accept, last)
  return jnp.any(choose(cap, extended, active, widths, width_costs) >= depth)
