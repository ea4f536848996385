"""int8 weights (`hamburger_jax.model.quantize`): the round trip, which tensors are quantized, and
the quantized model's outputs next to the float model's."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hamburger_jax.model import quantize as q
from hamburger_jax.model.config import LlamaConfig
from hamburger_jax.model.hamburger import HamburgerModel, dummy_batch
from hamburger_jax.model.llama import LlamaModel, init_llama_params
from hamburger_jax.testing.fixtures import random_params, tiny_config


@pytest.fixture(scope="module")
def model():
  cfg = tiny_config(2)
  return cfg, random_params(cfg, seed=0)


def _paths(tree, dtype):
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(p, simple=True, separator="/") for p, x in flat if x.dtype == dtype}


def _absmax_error(w, axis):
  scale = np.abs(w).max(axis=1 - axis, keepdims=True) / q.INT8_MAX
  return np.square(np.round(w / scale) * scale - w).sum(axis=1 - axis)


def test_round_trip_error_is_bounded():
  w = np.random.default_rng(0).standard_t(3, size=(48, 24)).astype(np.float32)  # heavy tails
  w[:, 3] = 0.0                                                   # an all-zero channel
  for axis in (1, 0):                                             # kernels, embedding rows
    qw, scale = q.quantize_array(w, axis=axis)
    assert qw.dtype == jnp.int8 and qw.shape == w.shape and scale.shape == (w.shape[axis],)
    assert int(jnp.max(jnp.abs(qw.astype(jnp.int32)))) <= q.INT8_MAX
    back = np.asarray(q.dequantize(qw, scale, axis=axis))
    s = np.expand_dims(np.asarray(scale), 1 - axis)
    inside = np.abs(w) <= q.INT8_MAX * s                          # not clipped: half a step
    assert np.all(np.abs(back - w)[inside] <= (s / 2 + 1e-7).repeat(w.shape[1 - axis],
                                                                     1 - axis)[inside])
    err = np.square(back - w).sum(axis=1 - axis)                  # never worse than absmax
    with np.errstate(invalid="ignore", divide="ignore"):
      assert np.all(err <= np.nan_to_num(_absmax_error(w, axis)) + 1e-6)
  assert np.all(np.asarray(q.quantize_array(w, 1)[0])[:, 3] == 0)


def test_decoding_matrices_are_int8_and_the_rest_stays(model):
  cfg, params = model
  qp = q.quantize_params(params, cfg)
  int8 = _paths(qp, jnp.int8)
  projections = {f"{part}/{name}" for part, names in (
      ("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
      ("mlp", ("gate_proj", "up_proj", "down_proj"))) for name in names}
  expected = {f"base/layers_{i}/{p}/kernel" for i in range(2) for p in projections}
  expected |= {f"micro_decoder/layers_{i}/{p}/kernel" for i in range(cfg.num_micro_layers)
               for p in projections}
  expected.add("base/embed_tokens/embedding")
  assert int8 == expected
  floats = jax.tree_util.tree_flatten_with_path(qp)[0]
  for path, leaf in floats:
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    if name.endswith("_scale") and name.rsplit("/", 1)[-1] != "scale":
      assert leaf.dtype == jnp.float32 and leaf.ndim == 1
  assert qp["embedder"]["q_proj"]["kernel"].dtype == params["embedder"]["q_proj"]["kernel"].dtype
  assert q.is_quantized(qp) and not q.is_quantized(params)
  assert q.weight_bytes(qp) < 0.4 * q.weight_bytes(params)       # float32 -> int8 (+ scales)
  again = q.quantize_params(qp, cfg)                               # idempotent
  assert jax.tree.structure(again) == jax.tree.structure(qp)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(qp)))


def test_int8_model_stays_close_to_the_float_model(model):
  cfg, params = model
  batch = dummy_batch(cfg, rows=2, length=8)
  batch["group_tokens"] = jax.random.randint(jax.random.PRNGKey(1), batch["group_tokens"].shape,
                                             0, cfg.base.vocab_size)
  apply = jax.jit(HamburgerModel(cfg).apply)
  ref = apply({"params": params}, batch)
  out = apply({"params": q.quantize_params(params, cfg)}, batch)
  scale = float(jnp.max(jnp.abs(ref.logits)))
  assert float(jnp.max(jnp.abs(out.logits - ref.logits))) < 0.05 * scale
  assert float(jnp.max(jnp.abs(out.stop_logits - ref.stop_logits))) < 0.05 * max(
      1.0, float(jnp.max(jnp.abs(ref.stop_logits))))


@pytest.mark.slow
def test_untied_head_and_its_rows():
  cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=4, num_kv_heads=2, head_dim=8, tie_word_embeddings=False)
  params = init_llama_params(cfg, jax.random.PRNGKey(0))
  params = jax.tree.map(lambda x: x * 4 if x.ndim == 2 else x, params)
  qp = q.quantize_params(params, cfg)
  assert qp["lm_head"]["kernel"].dtype == jnp.int8 and qp["lm_head"]["kernel_scale"].shape == (96,)
  rows = jnp.array([0, 5, 95])
  want = np.asarray(params["lm_head"]["kernel"])[:, [0, 5, 95]].T
  got = np.asarray(q.head_rows(qp, rows, tied=False, dtype=jnp.float32))
  assert np.allclose(got, want, atol=float(qp["lm_head"]["kernel_scale"].max()) / 2 + 1e-6)
  tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6)
  logits = jax.jit(lambda p: LlamaModel(cfg).apply({"params": p}, tokens).logits)
  ref, out = logits(params), logits(qp)
  assert float(jnp.max(jnp.abs(out - ref))) < 0.05 * float(jnp.max(jnp.abs(ref)))


def test_modes_and_the_shape_check(model):
  cfg, params = model
  assert q.parse_mode(None) is None and q.parse_mode("none") is None
  assert q.parse_mode("int8") == "int8"
  with pytest.raises(ValueError, match="quantize must be one of none, int8, got 'int4'"):
    q.parse_mode("int4")
  assert q.apply_mode(params, cfg, "none") is params
  with pytest.raises(ValueError, match="embedding"):
    q.quantize_params(params, dataclasses.replace(cfg.base, vocab_size=7))
