"""KV buffers stored as int8 with per-head scales (model/kv_cache.py)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hamburger_jax.model import kv_cache
from hamburger_jax.model.kv_attention import cached_attention
from hamburger_jax.model.llama import LlamaModel
from hamburger_jax.testing.fixtures import random_params, tiny_config
from tests import compiled

B, L, K, G, H = 3, 37, 2, 3, 8


def _normal(seed, shape, scale=1.0):
  return scale * jax.random.normal(jax.random.PRNGKey(seed), shape)


def _dequantized(values, scales):
  """int8 [B, L, K * H], scales [B, L, K] -> float32 [B, L, K, H]."""
  b, l, k = scales.shape
  return values.reshape(b, l, k, -1).astype(jnp.float32) * scales.astype(jnp.float32)[..., None]


def _buffers_dequantized(layer, name):
  """A layer's int8 buffer `name` ("k" / "v") -> float32 [B, L, K * H]."""
  values, scales = kv_cache.unpack(layer[name]), layer[name + "_scale"].swapaxes(1, 2)
  return _dequantized(values, scales).reshape(values.shape)


def test_quantized_heads_are_within_half_a_step_and_zeros_stay_zero():
  x = _normal(0, (2, 5, K, H), 3.0).at[0, 0, 1].set(0.0)
  values, scales = kv_cache.quantize_heads(x)
  assert values.dtype == jnp.int8 and values.shape == (2, 5, K * H)
  assert scales.dtype == kv_cache.SCALE_DTYPE and scales.shape == (2, 5, K)
  err = jnp.abs(_dequantized(values, scales) - x)
  assert bool(jnp.all(err <= scales.astype(jnp.float32)[..., None] / 2 * 1.01 + 1e-7))
  assert int(jnp.max(jnp.abs(values))) == 127          # the largest entry per head spans the range
  np.testing.assert_array_equal(np.asarray(values[0, 0, H:]), 0)
  assert float(scales[0, 0, 1]) == 0.0
  words = kv_cache.pack(values)                          # stored four to an int32 word
  assert words.dtype == jnp.int32 and words.shape == (2, 5, K * H // 4)
  np.testing.assert_array_equal(np.asarray(kv_cache.unpack(words)), np.asarray(values))


@pytest.mark.parametrize("overlay", [False, True])
def test_int8_attention_equals_attention_over_the_dequantized_buffers(overlay):
  """Scales applied to the scores and probabilities = attention over the dequantized keys and
  values (written first, or overlaid as cache_write "returned" does)."""
  t = 3
  q = _normal(1, (B, t, K * G, H))
  cfg = dataclasses.replace(tiny_config(2).base, num_kv_heads=K, head_dim=H)
  layer = kv_cache.init_layer_cache(cfg, B, L, "int8")
  old_k, old_v = _normal(2, (B, L, K, H)), _normal(3, (B, L, K, H), 2.0)
  layer = kv_cache.write_entries(layer, kv_cache.make_entries(layer, old_k, old_v),
                                 jnp.zeros((B,), jnp.int32))
  new = kv_cache.make_entries(layer, _normal(4, (B, t, K, H)), _normal(5, (B, t, K, H)))
  slots = jnp.asarray([0, 14, 33], jnp.int32)
  written = kv_cache.write_entries(layer, new, slots)
  got = (cached_attention(q, layer, slots, block=8, new=new) if overlay
         else cached_attention(q, written, slots, block=8))
  plain = {name: _buffers_dequantized(written, name) for name in ("k", "v")}
  np.testing.assert_allclose(got, cached_attention(q, plain, slots, block=8), rtol=1e-5,
                             atol=1e-5)


def test_int8_buffers_take_about_half_the_bytes_of_bfloat16():
  cfg = dataclasses.replace(tiny_config(2).base, dtype="bfloat16")
  ratio = kv_cache.bytes_per_slot(cfg, 2, "int8") / kv_cache.bytes_per_slot(cfg, 2)
  scale_bytes = jnp.dtype(kv_cache.SCALE_DTYPE).itemsize
  assert ratio == pytest.approx((cfg.head_dim + scale_bytes) / (2 * cfg.head_dim))
  leaves = jax.tree.leaves(jax.eval_shape(lambda: kv_cache.init_cache(cfg, 2, 4, 64, "int8")))
  assert sum(x.size * x.dtype.itemsize for x in leaves) == 4 * 64 * kv_cache.bytes_per_slot(
      cfg, 2, "int8")
  with pytest.raises(ValueError, match="use one of model, int8"):
    kv_cache.init_cache(cfg, 2, 4, 64, "fp8")
  odd = dataclasses.replace(cfg, num_kv_heads=1, head_dim=6)
  with pytest.raises(ValueError, match="kv_heads x head_dim = 6 must be a multiple of 4"):
    kv_cache.init_cache(odd, 1, 2, 8, "int8")


def test_cached_forward_with_int8_buffers_stays_close_to_the_model_dtype():
  """A prompt prefilled then extended token by token: logits with int8 buffers within a small
  fraction of their spread from those with float32 buffers."""
  cfg = tiny_config(2).base
  params = random_params(tiny_config(2), 0)["base"]
  tokens = jax.random.randint(jax.random.PRNGKey(6), (2, 12), 0, cfg.vocab_size)
  model = LlamaModel(cfg)

  def run(kv_dtype):
    cache = kv_cache.init_cache(cfg, cfg.num_layers, 2, 16, kv_dtype)
    out = compiled.apply(model, {"params": params}, tokens[:, :8], cache=cache,
                         cache_slots=jnp.zeros((2,), jnp.int32))
    logits = [out.logits]
    cache = out.cache
    for t in range(8, 12):
      step = compiled.apply(model, {"params": params}, tokens[:, t:t + 1],
                            positions=jnp.full((2, 1), t), cache=cache,
                            cache_slots=jnp.full((2,), t, jnp.int32))
      logits.append(step.logits)
      cache = step.cache
    return jnp.concatenate(logits, axis=1), cache

  want, _ = run("model")
  got, cache = run("int8")
  assert cache[0]["k"].dtype == jnp.int32 and cache[0]["k_scale"].shape == (2, cfg.num_kv_heads, 16)
  spread = float(jnp.std(want))
  assert float(jnp.max(jnp.abs(got - want))) < 0.05 * spread
  assert float(jnp.max(jnp.abs(got - want))) > 0.0        # int8 storage really was used
