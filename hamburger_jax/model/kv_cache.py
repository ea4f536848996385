"""The fixed-shape KV buffers of cached forwards: layout, int8 storage, writes.

    cache = init_cache(cfg, num_layers, batch, length)               # model dtype
    cache = init_cache(cfg, num_layers, batch, length, "int8")       # int8 + per-head scales
    entries = make_entries(layer_cache, k [B, T, K, H], v)           # in the buffers' format
    layer_cache = write_entries(layer_cache, entries, slots [B])

A layer's cache is a dict of buffers, rows first: {"k", "v"} [B, L, K * H] (heads flat: see
`kv_attention`). With int8 storage the values are int8 packed four to an int32 word, {"k", "v"}
int32 [B, L, K * H / 4] (`unpack` -> int8 [.., K * H]; on TPUs an int8 buffer is tiled 32 slots
deep and the loop would copy it whole every step to write one slot), and {"k_scale", "v_scale"}
float32 [B, K, L] hold a symmetric scale per head vector of H values (max |x| / 127): entry
(b, slot, head) reads `unpack(k)[b, slot, head] * k_scale[b, head, slot]`. The scales keep the
slots on the minor axis (`slot_axis`): with K on it a TPU pads K = 8 to 128 lanes and copies
the buffer whole every step. Every buffer has the rows first, so code that moves rows
(continuous batching, compaction) maps over the dict's leaves.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

LayerCache = dict[str, jax.Array]
KV_DTYPES = ("model", "int8")        # what a KV buffer stores: the model's dtype, or int8
SCALE_DTYPE = jnp.float32
PACK = 4                             # int8 values per stored int32 word
SCALES = ("k_scale", "v_scale")      # [B, K, L]; the values [B, L, W]


def slot_axis(name: str) -> int:
  """The axis of buffer `name` that indexes KV slots."""
  return 2 if name in SCALES else 1


def check_kv_dtype(kv_dtype: str, cfg=None) -> str:
  """kv_dtype, or ValueError naming the choices (or, given the LlamaConfig, a width int8
  buffers cannot pack)."""
  if kv_dtype not in KV_DTYPES:
    raise ValueError(f"KV cache {kv_dtype!r} is unknown: use one of {', '.join(KV_DTYPES)}.")
  width = cfg and cfg.num_kv_heads * cfg.head_dim
  if kv_dtype == "int8" and width and width % PACK:
    raise ValueError(f"int8 KV buffers pack {PACK} values per word: kv_heads x head_dim = "
                     f"{width} must be a multiple of {PACK} (use kv_cache 'model').")
  return kv_dtype


def init_layer_cache(cfg, batch: int, length: int, kv_dtype: str = "model") -> LayerCache:
  """Zero buffers for one layer (see the module docstring); cfg: a LlamaConfig."""
  # Separate arrays per buffer (one array twice could not be donated).
  width = cfg.num_kv_heads * cfg.head_dim
  if check_kv_dtype(kv_dtype, cfg) == "model":
    values = lambda: jnp.zeros((batch, length, width), cfg.jnp_dtype)
    return {"k": values(), "v": values()}
  values = lambda: jnp.zeros((batch, length, width // PACK), jnp.int32)
  scales = lambda: jnp.zeros((batch, cfg.num_kv_heads, length), SCALE_DTYPE)
  return {"k": values(), "v": values(), "k_scale": scales(), "v_scale": scales()}


def init_cache(cfg, num_layers: int, batch: int, length: int, kv_dtype: str = "model"):
  """A list of `num_layers` zero layer caches."""
  return [init_layer_cache(cfg, batch, length, kv_dtype) for _ in range(num_layers)]


def bytes_per_slot(cfg, num_layers: int, kv_dtype: str = "model") -> int:
  """Bytes one slot of one row takes in all layers' buffers."""
  heads = num_layers * cfg.num_kv_heads
  if check_kv_dtype(kv_dtype) == "model":
    return 2 * heads * cfg.head_dim * cfg.jnp_dtype.dtype.itemsize
  return 2 * heads * (cfg.head_dim + jnp.dtype(SCALE_DTYPE).itemsize)


def quantize_heads(x):
  """x [..., K, H] -> (int8 [..., K * H], scales [..., K]): round(x / s) with s = max |x| / 127
  per head vector, s rounded to SCALE_DTYPE first (so values and scale agree)."""
  x = x.astype(jnp.float32)
  scale = (jnp.max(jnp.abs(x), axis=-1) / 127.0).astype(SCALE_DTYPE)
  s = scale.astype(jnp.float32)[..., None]
  q = jnp.clip(jnp.round(jnp.where(s > 0, x / jnp.where(s > 0, s, 1.0), 0.0)), -127, 127)
  return q.astype(jnp.int8).reshape(x.shape[:-2] + (-1,)), scale


def pack(values):
  """int8 [..., W] -> int32 [..., W / 4] (the same bytes)."""
  words = values.reshape(values.shape[:-1] + (-1, PACK))
  return jax.lax.bitcast_convert_type(words, jnp.int32)


def unpack(words):
  """int32 [..., W / 4] -> int8 [..., W] (`pack`'s inverse)."""
  values = jax.lax.bitcast_convert_type(words, jnp.int8)
  return values.reshape(words.shape[:-1] + (-1,))


def make_entries(layer: LayerCache, k, v) -> LayerCache:
  """New keys and values k/v [B, T, K, H] in `layer`'s storage: the same keys, [B, T, ...]
  (scales [B, T, K])."""
  if "k_scale" not in layer:
    flat = lambda x, name: x.reshape(x.shape[:2] + (-1,)).astype(layer[name].dtype)
    return {"k": flat(k, "k"), "v": flat(v, "v")}
  (kq, ks), (vq, vs) = quantize_heads(k), quantize_heads(v)
  return {"k": pack(kq), "v": pack(vq), "k_scale": ks, "v_scale": vs}


def write_cache(buf, new, cache_slots, axis: int = 1):
  """Writes new [B, T, ...] into buf at per-row slots cache_slots [B] .. + T - 1 along `axis`:
  1 = buf [B, L, X] (new flattened to X after T), 2 = buf [B, X, L] (new [B, T, X]).
  Out-of-range writes drop."""
  b, t = new.shape[:2]
  rows = jnp.arange(b)[:, None]
  cols = cache_slots[:, None] + jnp.arange(t)[None, :]
  if axis == 1:
    return buf.at[rows, cols].set(new.reshape(b, t, -1).astype(buf.dtype), mode="drop")
  heads = jnp.arange(buf.shape[1])[None, None, :]
  return buf.at[rows[..., None], heads, cols[..., None]].set(new.astype(buf.dtype), mode="drop")


def write_entries(layer: LayerCache, entries: LayerCache, cache_slots) -> LayerCache:
  """`make_entries`' output written into every buffer of the layer at cache_slots [B]."""
  return {name: write_cache(layer[name], entries[name], cache_slots, slot_axis(name))
          for name in layer}
