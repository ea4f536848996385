"""How an int8 token table is stored and read: the lookup and the tied LM head over it.

    blocks = to_blocks(q)                  # int8 [V, D] -> [V / 32, 32, D], on a TPU
    rows = take(table, ids)                # the lookup [..., D], either layout
    logits = grouped_logits(h, flat(table), scale, dtype)   # the tied head, scales per group

XLA TPU tiles an int8 array 32 rows deep, and a decode step that gathered single rows of such a
table (the token embedding's lookup) re-tiled the whole table first, every step: for
Llama-3.2-1B a 263 MB read and write per lookup beside a 1.65 GB floor for a base step
(docs/results/tpu.md). Stored as blocks of 32 rows, [V / 32, 32, D], the same bytes in the
same order, a lookup gathers whole tiles in place, and `flat` is the [V, D] view the head's dot
reads as stored. `quantize.apply_mode` stores int8 tables this way where decoding runs on a TPU.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

ROWS = 32                 # rows per block: the depth of XLA TPU's int8 tile
# grouped_logits' TPU form while rows x groups stays within this (1B head at 8 rows: 512).
GROUP_PARTIAL_ROWS = 512


def is_blocked(table) -> bool:
  """Whether a table is stored as blocks [V / ROWS, ROWS, D]."""
  return getattr(table, "ndim", 0) == 3


def to_blocks(table):
  """[V, D] (V a multiple of ROWS) -> [V / ROWS, ROWS, D]."""
  return table.reshape(table.shape[0] // ROWS, ROWS, table.shape[1])


def flat(table):
  """The [V, D] view of a table in either layout."""
  return table.reshape(-1, table.shape[-1]) if is_blocked(table) else table


def take(table, ids):
  """Rows [..., D] of a table in either layout for ids [...]: from blocks, each id's whole block
  is gathered, then its row picked by a masked sum (XLA folds a gather of the row into a slice
  of one row of the table, which re-tiles it)."""
  if not is_blocked(table):
    return jnp.take(table, ids, axis=0)
  blocks = jnp.take(table, (ids // ROWS).reshape(-1), axis=0)                  # [N, ROWS, D]
  row = (ids % ROWS).reshape(-1, 1, 1) == jnp.arange(ROWS)[None, :, None]
  rows = jnp.sum(jnp.where(row, blocks, 0), axis=1).astype(table.dtype)        # the one row
  return rows.reshape(ids.shape + (table.shape[-1],))


def block_tables(tree: dict) -> dict:
  """The same tree with every int8 token embedding ({"embedding": int8 [V, D] and its
  "embedding_scale", as `quantize` stores it; V a multiple of ROWS}) stored as blocks."""
  out = {k: block_tables(v) if isinstance(v, dict) else v for k, v in tree.items()}
  table = tree.get("embedding")
  if (getattr(table, "dtype", None) == jnp.int8 and table.ndim == 2 and "embedding_scale" in tree
      and table.shape[0] % ROWS == 0):
    out["embedding"] = to_blocks(table)
  return out


def grouped_logits(hidden, table, scale, dtype):
  """hidden [..., D], int8 table [V, D], scale [V, n] (groups of G = D / n along D) -> logits
  [..., V] float32 = sum_g scale[:, g] * (hidden_g @ table_g.T).

  On a TPU with few rows (R * n <= GROUP_PARTIAL_ROWS) the hidden rows, spread so that each
  group's entries have their own row [R * n, D], meet the table in one plain dot whose output XLA
  scales and sums over groups in the same fusion: the int8 table is read once (1B head: 0.30 GB
  of HBM against 1.87 GB for the scaled table; docs/results/tpu.md). That dot does n times the
  FLOPs, which beyond those rows cost more than the bytes saved, and on a CPU always: elsewhere
  the group-scaled table feeds one dot."""
  if math.prod(hidden.shape[:-1]) * scale.shape[-1] > GROUP_PARTIAL_ROWS:
    return _scaled_table_logits(hidden, table, scale, dtype)
  return jax.lax.platform_dependent(
      hidden, table, scale, default=functools.partial(_scaled_table_logits, dtype=dtype),
      tpu=functools.partial(_group_partial_logits, dtype=dtype))


def _scaled_table_logits(hidden, table, scale, dtype):
  v, d = table.shape
  n = scale.shape[-1]
  scaled = table.reshape(v, n, d // n).astype(dtype) * scale[:, :, None].astype(dtype)
  return jnp.dot(hidden.astype(dtype), scaled.reshape(v, d).T, preferred_element_type=jnp.float32)


def _group_partial_logits(hidden, table, scale, dtype):
  d = table.shape[1]
  n = scale.shape[-1]
  x = hidden.reshape(-1, d).astype(dtype)                                      # [R, D]
  in_group = jnp.arange(n)[:, None] == jnp.arange(d)[None, :] // (d // n)    # [n, D]
  spread = (x[:, None, :] * in_group[None].astype(dtype)).reshape(-1, d)     # [R * n, D]
  parts = jnp.dot(spread, table.astype(dtype).T, preferred_element_type=jnp.float32)
  logits = jnp.einsum("rnv,vn->rv", parts.reshape(-1, n, table.shape[0]), scale)
  return logits.reshape(hidden.shape[:-1] + (table.shape[0],))
