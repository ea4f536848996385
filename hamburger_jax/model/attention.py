"""Grouped-query attention with an explicit KV cache (cache in, cache out).

Einsum letters: B batch, T query length, L key length, K kv heads, G query heads per kv head,
H head dim. A layer's cache is `{"k": [B, L, K * H], "v": [B, L, K * H]}` (heads flat; with int8
storage also their scales: see `kv_cache`); row b writes its T new entries at slots `cache_slots[b] .. cache_slots[b] + T - 1`.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from hamburger_jax.model import partitioning as pt
from hamburger_jax.model.attention_ops import packed_attention
from hamburger_jax.model.config import LlamaConfig
from hamburger_jax.model.execution import Execution
from hamburger_jax.model.kv_attention import cached_attention
from hamburger_jax.model.kv_cache import LayerCache, make_entries, write_entries
from hamburger_jax.model.layers import apply_rope, dense, rope_inv_freq

class Attention(nn.Module):
  """Llama GQA self-attention with RoPE at explicit positions."""
  cfg: LlamaConfig
  execution: Execution = Execution()

  @nn.compact
  def __call__(self, x, positions, segment_ids=None, cache: LayerCache | None = None,
               cache_slots=None, block_mask=None) -> tuple[jax.Array, Any]:
    """x [B, T, D], positions [B, T].

    Without a cache: causal attention within equal `segment_ids` [B, T] (packed rows), by the
    execution's attention implementation. With a cache, the new keys and values are written at
    `cache_slots` [B] and each query sees the buffer's slots up to its own (`cached_attention`:
    only the key blocks up to the highest such slot are read; block_mask [T, T]: the new entries
    form a tree instead, `kv_attention`).
    Returns (out [B, T, D], new cache), or with the execution's cache_write "returned" (out,
    the new entries in the buffers' format, [B, T, ..] each) and the buffers untouched.
    """
    c, ex = self.cfg, self.execution
    b, t, _ = x.shape
    q = dense(c.num_heads * c.head_dim, ("embed", "heads"), c, "q_proj")(x)
    k = dense(c.num_kv_heads * c.head_dim, ("embed", "kv_heads"), c, "k_proj")(x)
    v = dense(c.num_kv_heads * c.head_dim, ("embed", "kv_heads"), c, "v_proj")(x)
    heads = (pt.BATCH, pt.LENGTH, pt.HEADS, None)
    kv_heads = (pt.BATCH, pt.LENGTH, pt.KV_HEADS, None)
    q = pt.constrain(q.reshape(b, t, c.num_heads, c.head_dim), heads)
    k = pt.constrain(k.reshape(b, t, c.num_kv_heads, c.head_dim), kv_heads)
    v = pt.constrain(v.reshape(b, t, c.num_kv_heads, c.head_dim), kv_heads)
    inv_freq = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling)
    q = apply_rope(q, positions, inv_freq)
    k = apply_rope(k, positions, inv_freq)
    if cache is not None and ex.cache_write == "returned":
      new = make_entries(cache, k, v)
      out = cached_attention(q, cache, cache_slots, new=new, block_mask=block_mask)
      cache = new
    elif cache is not None:
      cache = write_entries(cache, make_entries(cache, k, v), cache_slots)
      out = cached_attention(q, cache, cache_slots, block_mask=block_mask)
    else:
      if segment_ids is None:
        segment_ids = jnp.ones((b, t), jnp.int32)
      out = packed_attention(q, k, v, segment_ids, ex.attention, ex.attention_block)
    out = pt.constrain(out, heads)
    out = dense(c.hidden_size, ("heads", "embed"), c, "o_proj")(out.reshape(b, t, -1))
    return out, cache
