"""Micro-step compaction: the micro prefill and micro steps run on the rows that continue.

With compaction, a macro step's continuing rows are gathered into the smallest row bucket that
holds them (`micro_buckets`), so the micro steps cost what their continuing rows cost, not what
the batch costs; the results are scattered back (the same numbers per row). Off by default: every
bucket is a branch the loop compiles, and on a CPU with plain dots the gathers bought no speed
(docs/results/serving.md). Also here: whether a forward without merged input skips the merge
(`skips_unmerged`; None: decided by the backend).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def micro_buckets(engine, batch: int) -> tuple[int, ...]:
  """Row counts a micro step may run at, for a batch bucket of `batch` rows.

  With `engine.compact_micro_steps` (batches of 4 rows or more) the rows that continue their
  group are gathered into the smallest bucket that holds them (the powers of two below the
  batch, and the batch), for the micro prefill and for each micro step.
  """
  if not engine.compact_micro_steps or batch < 4:
    return (batch,)
  return tuple(1 << i for i in range(batch.bit_length()) if 1 << i < batch) + (batch,)


def skips_unmerged(engine) -> bool:
  """Whether a forward with no merged input skips the embedder's merge and the merge adapter (a
  branch each, the same numbers). It spares every prefill and, at batch 1, most macro steps; a
  macro step with a merged row computes both for all rows. `engine.skip_unmerged` None: on CPU
  (where it was measured to help), off elsewhere."""
  skip = engine.skip_unmerged
  return jax.default_backend() == "cpu" if skip is None else skip


def bucket_index(buckets, count):
  """[] i32: the index of the smallest bucket that holds `count` rows."""
  return jnp.sum(jnp.asarray(buckets) < count)


def continuing_first(active, rows: int):
  """[rows] i32: the indices of the rows with active [B] True first (stable), then the others."""
  return jnp.argsort(~active, stable=True)[:rows]


def micro_prefill_rows(engine, params, features, active, rows: int):
  """The micro prefill of the first `rows` rows with active [B] True (gathered), scattered into a
  zero cache of all B rows: a row that does not continue its group is never read again in this
  macro step, so its micro cache need not be computed."""
  b = features.shape[0]
  if rows == b:
    return engine.model.micro_prefill(params, features)
  idx = continuing_first(active, rows)
  part = engine.model.micro_prefill(params, jnp.take(features, idx, axis=0))
  return jax.tree_util.tree_map(
      lambda x: jnp.zeros((b,) + x.shape[1:], x.dtype).at[idx].set(x), part)


def micro_step_rows(step, c, keys, knobs, budget, rows: int):
  """step(prev, j, cache, keys, knobs, budget) -> (pick, cache) on the first `rows` continuing
  rows of the micro carry `c` (gathered), scattered back -> (pick [B], micro cache). Rows left
  out, or in the bucket but not continuing, are never read again in this macro step (their group
  has ended)."""
  b = c.prev.shape[0]
  if rows == b:
    return step(c.prev, c.step, c.cache, keys, knobs, budget)
  idx = continuing_first(c.active, rows)
  take = lambda x: jnp.take(x, idx, axis=0)
  pick, part = step(take(c.prev), c.step, jax.tree_util.tree_map(take, c.cache), take(keys),
                    jax.tree_util.tree_map(take, knobs), take(budget))
  scatter = lambda full, x: full.at[idx].set(x)
  cache = jax.tree_util.tree_map(scatter, c.cache, part)
  pick = jax.tree_util.tree_map(lambda x: scatter(jnp.zeros((b,) + x.shape[1:], x.dtype), x),
                                pick)
  return pick, cache
