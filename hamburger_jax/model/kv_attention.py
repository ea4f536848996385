"""Attention of new queries over a fixed-shape KV buffer, visiting only the key blocks in use.

    out = cached_attention(q [B, T, N, H], layer, cache_slots [B])   # layer: {"k", "v", ..}
    out = cached_attention(.., new=entries)     # entries [B, T, ..] per buffer, not yet written
    out = cached_attention(.., block_mask=m)    # m [T, T] bool: query t sees new entry u iff m[t, u]

`layer` is one layer's buffers (`kv_cache`): k/v [B, L, K * H], or for int8 storage packed
int8 values and their per-head scales [B, K, L] (blocks of them turned to [B, blk, K]), applied
to the scores (keys) and to the probabilities (values), so no dequantized block is formed. The
buffers keep the heads flat (K * H on the minor axis): on TPUs an H = 64 minor axis is padded
to 128 lanes and the loop would copy the whole buffer into another layout; blocks are reshaped
to [B, blk, K, H] (and cast to q's dtype) after slicing. Query t of row b sees the buffer's
slots <= cache_slots[b] + t. The keys are read in blocks of `block` slots by a loop whose trip
count is traced: blocks up to the highest slot any query sees, so a decode step costs what the
filled part of the buffer costs, not its length L (one compile for every fill level). Online
softmax in float32 across blocks; a block a row sees none of adds exactly zero to that row, so
a row's numbers do not depend on the other rows' fill levels. With `block_mask` the T new
entries are a tree (verified decoding's draft tree, `decode/draft_tree.py`): query t sees the
committed slots before cache_slots[b] and the new entries u with block_mask[t, u] (its
ancestors and itself), not the causal prefix.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hamburger_jax.model.kv_cache import SCALES, slot_axis, unpack

NEG_INF = -1e30
KV_BLOCK = 64    # slots per key block (docs/results/step_costs.md)


def _per_key(scale):
  """Scales [B, blk, K] -> [B, 1, K, 1, blk], to multiply scores / probabilities."""
  return scale.astype(jnp.float32).transpose(0, 2, 1)[:, None, :, None, :]


def _block_update(carry, qg, kj, vj, visible, scales=None):
  """One key block: qg [B, T, K, G, H], kj/vj [B, blk, K, H], visible [B, T, blk]; scales:
  int8 storage's (k_scale, v_scale) [B, blk, K] or None."""
  m, l, acc = carry
  s = jnp.einsum("btkgh,blkh->btkgl", qg, kj, preferred_element_type=jnp.float32)
  s = s / jnp.sqrt(jnp.float32(qg.shape[-1]))
  if scales is not None:
    s = s * _per_key(scales[0])
  mask = visible[:, :, None, None]
  m_new = jnp.maximum(m, jnp.max(jnp.where(mask, s, NEG_INF), axis=-1))
  p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
  corr = jnp.exp(m - m_new)
  pv_weights = p if scales is None else p * _per_key(scales[1])
  pv = jnp.einsum("btkgl,blkh->btkgh", pv_weights.astype(vj.dtype), vj,
                  preferred_element_type=jnp.float32)
  return m_new, l * corr + jnp.sum(p, axis=-1), acc * corr[..., None] + pv


def _overlay(block_kv, idx, new, cache_slots):
  """block_kv [B, blk, X] read from a buffer at slots idx [blk], with row b's new entries new
  [B, T, X] placed at slots cache_slots[b] .. + T - 1 (what an in-place write would hold)."""
  offset = idx[None, :] - cache_slots[:, None]                                      # [B, blk]
  inside = (offset >= 0) & (offset < new.shape[1])
  picked = jnp.take_along_axis(new, jnp.clip(offset, 0, new.shape[1] - 1)[..., None], axis=1)
  return jnp.where(inside[..., None], picked, block_kv)


def cached_attention(q, layer, cache_slots, block: int = KV_BLOCK, new=None, block_mask=None):
  """-> [B, T, N, H]; see the module docstring. new: entries [B, T, ..] for each of layer's
  buffers (`kv_cache.make_entries`), not in the buffers yet, read as if written at cache_slots
  (same numbers). block_mask: [T, T] bool or None (causal)."""
  b, t, n, h = q.shape
  length = layer["k"].shape[1]
  kv_heads = layer["k_scale"].shape[1] if "k_scale" in layer else layer["k"].shape[2] // h
  block = min(block, length)
  qg = q.reshape(b, t, kv_heads, n // kv_heads, h)
  query_slot = cache_slots[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]        # [B, T]
  num_blocks = jnp.clip(jnp.max(query_slot) // block + 1, 1, -(-length // block))

  def body(j, carry, overlay: bool):
    # The last block is shifted back to end at L; slots an earlier block covered are masked.
    start = jnp.minimum(j * block, length - block)
    idx = start + jnp.arange(block, dtype=jnp.int32)
    visible = (idx[None, None, :] <= query_slot[:, :, None]) & (idx >= j * block)[None, None, :]
    if block_mask is not None:
      offset = idx[None, :] - cache_slots[:, None]                                  # [B, blk]
      inside = (offset >= 0) & (offset < t)
      sees = jnp.asarray(block_mask)[:, jnp.clip(offset, 0, t - 1)].transpose(1, 0, 2)
      visible = visible & (~inside[:, None, :] | sees)
    blk = {name: jax.lax.dynamic_slice_in_dim(x, start, block, axis=slot_axis(name))
           for name, x in layer.items()}
    blk = {name: x.swapaxes(1, 2) if name in SCALES else x for name, x in blk.items()}
    if overlay:
      blk = {name: _overlay(x, idx, new[name], cache_slots) for name, x in blk.items()}
    scales = (blk["k_scale"], blk["v_scale"]) if "k_scale" in blk else None
    values = (lambda x: x) if scales is None else unpack
    kj, vj = (values(blk[name]).reshape(b, block, kv_heads, h).astype(q.dtype)
              for name in ("k", "v"))
    return _block_update(carry, qg, kj, vj, visible, scales)

  stats = qg.shape[:4]
  init = (jnp.full(stats, NEG_INF, jnp.float32), jnp.zeros(stats, jnp.float32),
          jnp.zeros(qg.shape, jnp.float32))
  # With new entries, the blocks before the lowest row's first new slot are read as stored
  # (the same numbers: the overlay changes nothing there) and only the rest take the overlay,
  # which a TPU writes out per block.
  first = num_blocks if new is None else jnp.minimum(jnp.min(cache_slots) // block, num_blocks)
  carry = jax.lax.fori_loop(0, first, functools.partial(body, overlay=False), init)
  if new is not None:
    with jax.named_scope("new_entries"):
      carry = jax.lax.fori_loop(first, num_blocks, functools.partial(body, overlay=True), carry)
  _, l, acc = carry
  # Slot 0 is visible to every query, so l > 0 (the guard only keeps stray rows finite).
  out = acc / jnp.maximum(l, jnp.finfo(jnp.float32).tiny)[..., None]
  return out.reshape(b, t, n, h).astype(q.dtype)
