"""How many drafts a verified step sends: the forward width with the most expected tokens per cost.

A verified forward runs at one of the static widths of `verify.forward_widths(S)` (1, 2, 4),
the smallest that holds the batch's longest pending input; its cost grows with the width (on
this project's CPU a 4-wide forward of the shipped model costs about 1.5x a 1-wide one, more
so at larger batches; on a memory-bound accelerator about the same). Each row's drafts come with
the stop head's estimate that each is accepted given the ones before (the verification stop
head is trained for exactly that: `train/drafter.py`). The rule picks the width

    w* = argmax_w E(w) / cost(w),   E(w) = sum over running rows r of
                                           1 + sum_{1 <= j < w, j <= k_r} prod_{i <= j} a_{r,i}

(k_r: the row's drafts, a_{r,i}: draft i's acceptance estimate) and sends each row its first
min(k_r, w* - 1) drafts; the others are dropped unverified. With equal costs it keeps every
draft (the widest width never buys fewer expected tokens).

Off unless asked for (`Sampler(.., draft_width_rule=True)`): on the shipped model and this CPU it
sent fewer drafts for no gain, 1.22x / 1.24x the base with / without it at batch 1, 0.97x /
0.96x at batch 8 (docs/results/quality.md): the costs above leave out the step's fixed work
(drafting, bookkeeping), which makes wide forwards look dearer than they are.

    num_drafts = choose(num_drafts, accept, active, widths, costs(batch, widths))
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

# A verified step's base forward plus LM head at widths 1, 2, 4 relative to width 1, per batch
# size: the shipped HAMburger-SmolLM2 on the 2-core CPU of docs/results/quality.md (float32,
# 200 KV slots filled; `python -m benchmarks.step_costs --what verify_widths`).
CPU_WIDTHS = (1, 2, 4)
CPU_COSTS = {1: (1.0, 1.19, 1.40), 8: (1.0, 1.21, 1.53), 32: (1.0, 1.22, 1.86)}


def enabled(engine) -> bool:
  """`engine.draft_width_rule` (None: off; see the module docstring)."""
  return bool(engine.draft_width_rule)


def costs(batch: int, widths) -> tuple[float, ...]:
  """The relative cost of each width at this batch size: the measured batch size nearest below
  (or the smallest), interpolated over the widths."""
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
