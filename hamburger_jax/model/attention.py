"""Grouped-query attention with an explicit KV cache (cache in, cache out).

Einsum letters: B batch, T query length, L key length, K kv heads, G query heads per kv head,
H head dim. A layer's cache is `{"k": [B, L, K, H], "v": [B, L, K, H]}`; row b writes its T new
entries at slots `cache_slots[b] .. cache_slots[b] + T - 1`.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from hamburger_jax.model.config import LlamaConfig
from hamburger_jax.model.layers import apply_rope, dense, rope_inv_freq

LayerCache = dict[str, jax.Array]
_NEG_INF = -1e30


def init_layer_cache(cfg: LlamaConfig, batch: int, length: int, dtype=None) -> LayerCache:
  """Zero KV buffers [batch, length, kv_heads, head_dim] for one layer."""
  shape = (batch, length, cfg.num_kv_heads, cfg.head_dim)
  dtype = dtype or cfg.jnp_dtype
  return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def init_cache(cfg: LlamaConfig, num_layers: int, batch: int, length: int, dtype=None):
  """A list of `num_layers` zero layer caches."""
  return [init_layer_cache(cfg, batch, length, dtype) for _ in range(num_layers)]


def causal_segment_mask(segment_ids):
  """[B, T] segment ids -> [B, T, T] mask: causal and within the same segment."""
  t = segment_ids.shape[-1]
  causal = jnp.tril(jnp.ones((t, t), bool))
  same = segment_ids[:, :, None] == segment_ids[:, None, :]
  return causal[None] & same


def cache_mask(cache_slots, query_len: int, cache_len: int):
  """[B] first slots -> [B, T, L] mask: query t of row b sees slots <= cache_slots[b] + t."""
  query_slot = cache_slots[:, None] + jnp.arange(query_len)[None, :]  # [B, T]
  return jnp.arange(cache_len)[None, None, :] <= query_slot[:, :, None]


def write_cache(buf, new, cache_slots):
  """Writes new [B, T, K, H] into buf [B, L, K, H] at per-row slots; out-of-range writes drop."""
  b, t = new.shape[:2]
  rows = jnp.arange(b)[:, None]
  cols = cache_slots[:, None] + jnp.arange(t)[None, :]
  return buf.at[rows, cols].set(new.astype(buf.dtype), mode="drop")


def dot_product_attention(q, k, v, mask):
  """q [B, T, N, H], k/v [B, L, K, H], mask [B, T, L] -> [B, T, N, H] (softmax in float32)."""
  b, t, n, h = q.shape
  kv_heads = k.shape[2]
  q = q.reshape(b, t, kv_heads, n // kv_heads, h)
  scores = jnp.einsum("btkgh,blkh->bkgtl", q, k, preferred_element_type=jnp.float32)
  scores = scores / jnp.sqrt(jnp.float32(h))
  scores = jnp.where(mask[:, None, None], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgtl,blkh->btkgh", probs, v)
  return out.reshape(b, t, n, h)


class Attention(nn.Module):
  """Llama GQA self-attention with RoPE at explicit positions."""
  cfg: LlamaConfig

  @nn.compact
  def __call__(self, x, positions, mask=None, cache: LayerCache | None = None,
               cache_slots=None) -> tuple[jax.Array, Any]:
    """x [B, T, D], positions [B, T].

    Without a cache, `mask` [B, T, T] says which keys each query sees. With a cache, the new keys
    and values are written at `cache_slots` [B] and the queries attend over the whole buffer
    (`mask` [B, T, L], default: slots up to the query's own). Returns (out [B, T, D], new cache).
    """
    c = self.cfg
    b, t, _ = x.shape
    q = dense(c.num_heads * c.head_dim, ("embed", "heads"), c, "q_proj")(x)
    k = dense(c.num_kv_heads * c.head_dim, ("embed", "kv_heads"), c, "k_proj")(x)
    v = dense(c.num_kv_heads * c.head_dim, ("embed", "kv_heads"), c, "v_proj")(x)
    q = q.reshape(b, t, c.num_heads, c.head_dim)
    k = k.reshape(b, t, c.num_kv_heads, c.head_dim)
    v = v.reshape(b, t, c.num_kv_heads, c.head_dim)
    inv_freq = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling)
    q = apply_rope(q, positions, inv_freq)
    k = apply_rope(k, positions, inv_freq)
    if cache is not None:
      cache = {"k": write_cache(cache["k"], k, cache_slots),
               "v": write_cache(cache["v"], v, cache_slots)}
      k, v = cache["k"].astype(q.dtype), cache["v"].astype(q.dtype)
      if mask is None:
        mask = cache_mask(cache_slots, t, k.shape[1])
    out = dot_product_attention(q, k, v, mask)
    out = dense(c.hidden_size, ("heads", "embed"), c, "o_proj")(out.reshape(b, t, -1))
    return out, cache
