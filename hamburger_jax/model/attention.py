"""Grouped-query attention with an explicit KV cache (cache in, cache out).

Einsum letters: B batch, T query length, L key length, K kv heads, G query heads per kv head,
H head dim. A layer's cache is `{"k": [B, L, K * H], "v": [B, L, K * H]}` (heads flat: see
`kv_attention`); row b writes its T new entries at slots `cache_slots[b] .. cache_slots[b] + T - 1`.
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
from hamburger_jax.model.layers import apply_rope, dense, rope_inv_freq

LayerCache = dict[str, jax.Array]


def init_layer_cache(cfg: LlamaConfig, batch: int, length: int, dtype=None) -> LayerCache:
  """Zero KV buffers [batch, length, kv_heads * head_dim] for one layer."""
  shape = (batch, length, cfg.num_kv_heads * cfg.head_dim)
  dtype = dtype or cfg.jnp_dtype
  return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def init_cache(cfg: LlamaConfig, num_layers: int, batch: int, length: int, dtype=None):
  """A list of `num_layers` zero layer caches."""
  return [init_layer_cache(cfg, batch, length, dtype) for _ in range(num_layers)]


def write_cache(buf, new, cache_slots):
  """Writes new [B, T, K, H] into buf [B, L, K * H] at per-row slots; out-of-range writes drop."""
  b, t = new.shape[:2]
  new = new.reshape(b, t, -1)
  rows = jnp.arange(b)[:, None]
  cols = cache_slots[:, None] + jnp.arange(t)[None, :]
  return buf.at[rows, cols].set(new.astype(buf.dtype), mode="drop")


class Attention(nn.Module):
  """Llama GQA self-attention with RoPE at explicit positions."""
  cfg: LlamaConfig
  execution: Execution = Execution()

  @nn.compact
  def __call__(self, x, positions, segment_ids=None, cache: LayerCache | None = None,
               cache_slots=None) -> tuple[jax.Array, Any]:
    """x [B, T, D], positions [B, T].

    Without a cache: causal attention within equal `segment_ids` [B, T] (packed rows), by the
    execution's attention implementation. With a cache, the new keys and values are written at
    `cache_slots` [B] and each query sees the buffer's slots up to its own (`cached_attention`:
    only the key blocks up to the highest such slot are read).
    Returns (out [B, T, D], new cache), or with the execution's cache_write "returned" (out,
    the new entries {"k", "v"} [B, T, K * H]) and the buffers untouched.
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
      new = {name: x.reshape(b, t, -1).astype(cache[name].dtype)
             for name, x in (("k", k), ("v", v))}
      out = cached_attention(q, cache["k"], cache["v"], cache_slots, new_kv=(new["k"], new["v"]))
      cache = new
    elif cache is not None:
      cache = {"k": write_cache(cache["k"], k, cache_slots),
               "v": write_cache(cache["v"], v, cache_slots)}
      out = cached_attention(q, cache["k"], cache["v"], cache_slots)
    else:
      if segment_ids is None:
        segment_ids = jnp.ones((b, t), jnp.int32)
      out = packed_attention(q, k, v, segment_ids, ex.attention, ex.attention_block)
    out = pt.constrain(out, heads)
    out = dense(c.hidden_size, ("heads", "embed"), c, "o_proj")(out.reshape(b, t, -1))
    return out, cache
