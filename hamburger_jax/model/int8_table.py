"""How an int8 token table is stored and read: the lookup and the tied LM head over it.

    blocks = to_blocks(q)                  # int8 [V, D] -> [V / 32, 32, D], on a TPU
    rows = take(table, ids)                # the lookup [..., D], either layout
    logits = grouped_logits(h, table, scale, dtype)   # the tied head, scales per group

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
# Beyond them, on a TPU, a chunk of the scaled table holds at most this many bytes.
CHUNK_BYTES = 8 << 20


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
  """hidden [..., D], int8 table [V, D] or its blocks, scale [V, n] (groups of G = D / n along D)
  -> logits [..., V] float32 = sum_g scale[:, g] * (hidden_g @ table_g.T).

  On a TPU the int8 table is read once per call, where one group-scaled table would be written
  out and read back (docs/results/tpu.md): with few rows (R * n <= GROUP_PARTIAL_ROWS) the hidden
  rows, spread so that each group's entries have their own row [R * n, D], meet the table in one
  plain dot whose output XLA scales and sums over groups in the same fusion (n times the FLOPs);
  with more rows a blocked table is scaled and multiplied chunk by chunk, each chunk's scaled
  rows small enough to stay on chip. Elsewhere, and on a CPU always, the group-scaled table
  feeds one dot."""
  rows = math.prod(hidden.shape[:-1])
  if rows * scale.shape[-1] <= GROUP_PARTIAL_ROWS:
    tpu = _group_partial_logits
  elif is_blocked(table) and _chunk_rows(table, dtype) < flat(table).shape[0]:
    tpu = _chunked_logits
  else:
    return _scaled_table_logits(hidden, table, scale, dtype)
  return jax.lax.platform_dependent(
      hidden, table, scale, default=functools.partial(_scaled_table_logits, dtype=dtype),
      tpu=functools.partial(tpu, dtype=dtype))


def _chunk_rows(table, dtype) -> int:
  """Rows per chunk of `_chunked_logits`: whole blocks, CHUNK_BYTES of scaled rows at most."""
  row_bytes = table.shape[-1] * jnp.dtype(dtype).itemsize
  return max(ROWS, CHUNK_BYTES // row_bytes // ROWS * ROWS)


def _chunked_logits(hidden, table, scale, dtype):
  """The scaled table's dot, CHUNK rows at a time from blocks [V / ROWS, ROWS, D]: a chunk's
  block slice is read in place, and the last chunk starts early enough to end at V (its
  overlap recomputes the same logits)."""
  v, d = flat(table).shape
  chunk = _chunk_rows(table, dtype)
  x = hidden.reshape(-1, d)

  def one(i, out):
    start = jnp.minimum(i * chunk, v - chunk)
    rows = jax.lax.dynamic_slice_in_dim(table, start // ROWS, chunk // ROWS).reshape(chunk, d)
    logits = _scaled_table_logits(x, rows, jax.lax.dynamic_slice_in_dim(scale, start, chunk),
                                  dtype)
    return jax.lax.dynamic_update_slice_in_dim(out, logits, start, axis=1)

  out = jax.lax.fori_loop(0, -(-v // chunk), one, jnp.zeros((x.shape[0], v), jnp.float32))
  return out.reshape(hidden.shape[:-1] + (v,))


def _scaled_table_logits(hidden, table, scale, dtype):
  table = flat(table)
  v, d = table.shape
  n = scale.shape[-1]
  scaled = table.reshape(v, n, d // n).astype(dtype) * scale[:, :, None].astype(dtype)
  return jnp.dot(hidden.astype(dtype), scaled.reshape(v, d).T, preferred_element_type=jnp.float32)


def _group_partial_logits(hidden, table, scale, dtype):
  table = flat(table)
  d = table.shape[1]
  n = scale.shape[-1]
  x = hidden.reshape(-1, d).astype(dtype)                                      # [R, D]
  in_group = jnp.arange(n)[:, None] == jnp.arange(d)[None, :] // (d // n)    # [n, D]
  spread = (x[:, None, :] * in_group[None].astype(dtype)).reshape(-1, d)     # [R * n, D]
  parts = jnp.dot(spread, table.astype(dtype).T, preferred_element_type=jnp.float32)
  logits = jnp.einsum("rnv,vn->rv", parts.reshape(-1, n, table.shape[0]), scale)
  return logits.reshape(hidden.shape[:-1] + (table.shape[0],))
