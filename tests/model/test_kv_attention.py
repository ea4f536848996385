"""Decode-time attention over the filled KV blocks only: same numbers as full masked attention."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hamburger_jax.model.attention_ops import xla_attention
from hamburger_jax.model.kv_attention import cached_attention

B, L, K, G, H = 3, 37, 2, 3, 8      # L not a multiple of the block: the last block is shifted


def _inputs(t, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  q = jax.random.normal(keys[0], (B, t, K * G, H))
  k = jax.random.normal(keys[1], (B, L, K, H))
  v = jax.random.normal(keys[2], (B, L, K, H))
  return q, k, v


def _flat(x):
  """[B, L, K, H] -> the cache's [B, L, K * H]."""
  return x.reshape(x.shape[:2] + (-1,))


def _layer(k, v):
  """k/v [B, L, K, H] -> a layer's buffers in the model's dtype."""
  return {"k": _flat(k), "v": _flat(v)}


def _reference(q, k, v, slots):
  t = q.shape[1]
  query_slot = slots[:, None] + jnp.arange(t)[None, :]
  mask = jnp.arange(L)[None, None, :] <= query_slot[:, :, None]
  return xla_attention(q, k, v, mask)


@pytest.mark.slow
def test_equals_full_masked_attention_at_any_fill_level():
  for t, slots in ((1, [0, 9, 36]), (1, [20, 3, 17]), (5, [0, 8, 32]), (4, [16, 16, 1])):
    q, k, v = _inputs(t)
    slots = jnp.asarray(slots, jnp.int32)
    got = cached_attention(q, _layer(k, v), slots, block=8)
    np.testing.assert_allclose(got, _reference(q, k, v, slots), rtol=2e-5, atol=2e-6)


def test_a_row_does_not_depend_on_the_other_rows_fill_level():
  """Blocks a row sees none of add exactly zero: row 0 is bit-identical alone and in a batch
  whose other rows make the loop visit every block."""
  q, k, v = _inputs(1, seed=1)
  alone = cached_attention(q[:1], _layer(k[:1], v[:1]), jnp.asarray([5], jnp.int32),
                          block=8)
  batched = cached_attention(q, _layer(k, v), jnp.asarray([5, 36, 30], jnp.int32), block=8)
  np.testing.assert_array_equal(np.asarray(alone[0]), np.asarray(batched[0]))


def test_one_compile_for_every_fill_level():
  traces = []

  def fn(q, k, v, slots):
    traces.append(1)
    return cached_attention(q, _layer(k, v), slots, block=8)

  jitted = jax.jit(fn)
  q, k, v = _inputs(1)
  for slots in ([0, 0, 0], [36, 2, 9], [17, 30, 1]):
    slots = jnp.asarray(slots, jnp.int32)
    np.testing.assert_allclose(jitted(q, k, v, slots), _reference(q, k, v, slots), rtol=2e-5,
                               atol=2e-6)
  assert len(traces) == 1


@pytest.mark.parametrize("slots", [[0, 14, 35], [17, 26, 35]])
def test_new_entries_overlaid_are_bit_identical_to_entries_written(slots):
  """cache_write "returned": the buffer is only read and the new entries are overlaid on the key
  blocks from the lowest row's first new slot on (blocks before it read as stored); the numbers
  are those of writing them first (row 2 writes past the end: dropped)."""
  from hamburger_jax.model.kv_cache import write_cache
  t = 4
  q, k, v = _inputs(t, seed=2)
  _, k_new, v_new = _inputs(t, seed=3)
  k_new, v_new = k_new[:, :t], v_new[:, :t]
  slots = jnp.asarray(slots, jnp.int32)
  written = cached_attention(q, {"k": write_cache(_flat(k), k_new, slots),
                                 "v": write_cache(_flat(v), v_new, slots)}, slots, block=8)
  overlaid = cached_attention(q, _layer(k, v), slots, block=8, new=_layer(k_new, v_new))
  np.testing.assert_array_equal(np.asarray(overlaid), np.asarray(written))
