"""int8 weights (`hamburger_jax.model.quantize`): the round trip, which tensors are quantized, the
quantized model's outputs next to the float model's, and group-wise scales ("int8:G")."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hamburger_jax.model import int8_table
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
  assert q.parse_mode("int8") == "int8" and q.parse_mode("int8:64") == "int8:64"
  assert q.group_size("int8:64") == 64 and q.group_size("int8") is None
  assert q.group_size("int8:32z") == 32 and q.has_zero("int8:32z") and not q.has_zero("int8:32")
  for bad in ("int4", "int8:0", "int8:", "int8:x", "int8:-2", "int8:z", "int8:32zz"):
    with pytest.raises(q.QuantizeError, match="quantize must be one of none, int8, int8:G, "
                                              "int8:Gz, micro:<mode> "
                                              rf"\(G: .*\), got '{bad}'"):
      q.parse_mode(bad)
  assert q.apply_mode(params, cfg, "none") is params
  assert q.drafter_only("micro:int8:32z") and not q.drafter_only("int8:32z")
  assert q.group_size("micro:int8:32z") == 32 and q.has_zero("micro:int8:32z")
  for bad in ("micro:", "micro:int4", "micro:micro:int8"):
    with pytest.raises(q.QuantizeError, match=f"got '{bad}'"):
      q.parse_mode(bad)


def test_the_drafter_alone(model):
  """"micro:int8": the micro decoder's kernels int8 as "int8" makes them, the rest the same
  arrays; a plain Llama's params (no drafter) unchanged; a group the micro widths refuse."""
  cfg, params = model
  got = q.apply_mode(params, cfg, "micro:int8")
  whole = q.quantize_params(params, cfg)
  for name in params:
    want = whole if name == "micro_decoder" else params
    for a, b in zip(jax.tree.leaves(want[name]), jax.tree.leaves(got[name])):
      assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b)), name
  assert q.is_quantized(got["micro_decoder"]) and not q.is_quantized(got["base"])
  assert q.apply_mode(params["base"], cfg.base, "micro:int8") is params["base"]
  with pytest.raises(q.QuantizeError, match="micro_decoder/.* use a G that divides"):
    q.apply_mode(params, cfg, "micro:int8:7")
  with pytest.raises(ValueError, match="embedding"):
    q.quantize_params(params, dataclasses.replace(cfg.base, vocab_size=7))


# Group-wise scales ("int8:G").

def _per_channel_reference(w, axis):
  """The per-channel search written out for a 2-D w: (int8 q, float32 scale [w.shape[axis]])."""
  w = jnp.asarray(w, jnp.float32)
  amax = jnp.max(jnp.abs(w), axis=1 - axis, keepdims=True)
  errs, qs, scales = [], [], []
  for ratio in q.CLIP_RATIOS:
    scale = jnp.where(amax > 0, amax * ratio / q.INT8_MAX, 1.0)
    qw = jnp.clip(jnp.round(w / scale), -q.INT8_MAX, q.INT8_MAX)
    errs.append(jnp.sum(jnp.square(qw * scale - w), axis=1 - axis, keepdims=True))
    qs.append(qw)
    scales.append(scale)
  pick = np.zeros(np.shape(errs[0]), int)                 # the first ratio of least error
  best = np.asarray(errs[0])
  for i, err in enumerate(errs[1:], 1):
    pick = np.where(np.asarray(err) < best, i, pick)
    best = np.minimum(best, np.asarray(err))
  qw = np.choose(np.broadcast_to(pick, w.shape), [np.asarray(x) for x in qs])
  scale = np.choose(pick, [np.asarray(x) for x in scales])
  return qw.astype(np.int8), scale.reshape(-1).astype(np.float32)


def _dequantized(tree):
  """A quantized params tree -> float params holding the dequantized weights (no scales)."""
  out = {}
  for name, value in tree.items():
    if isinstance(value, dict):
      out[name] = _dequantized(value)
    elif name in (q.KERNEL_SCALE, q.KERNEL_ZERO, q.EMBEDDING_SCALE):
      continue
    elif name == "kernel" and q.KERNEL_SCALE in tree:
      out[name] = q.dequantize(value, tree[q.KERNEL_SCALE], axis=1, zero=tree.get(q.KERNEL_ZERO))
    elif name == "embedding" and q.EMBEDDING_SCALE in tree:
      out[name] = q.dequantize(value, tree[q.EMBEDDING_SCALE], axis=0)
    else:
      out[name] = value
  return out


def test_grouped_round_trip_error_is_bounded():
  w = np.random.default_rng(1).standard_t(3, size=(48, 24)).astype(np.float32)  # heavy tails
  w[8:16, 5] = 0.0                              # an all-zero group of a kernel's channel
  for axis, scale_shape in ((1, (6, 24)), (0, (48, 3))):   # kernel [in, out], embedding [V, D]
    qw, scale = q.quantize_array(w, axis=axis, group=8)
    assert qw.dtype == jnp.int8 and qw.shape == w.shape and scale.shape == scale_shape
    assert scale.dtype == jnp.float32
    back = np.asarray(q.dequantize(qw, scale, axis=axis))
    s = np.repeat(np.asarray(scale), 8, axis=1 - axis)      # each weight's own scale
    inside = np.abs(w) <= q.INT8_MAX * s
    assert inside.mean() > 0.9
    assert np.all(np.abs(back - w)[inside] <= s[inside] / 2 + 1e-7)
    per_channel = np.asarray(q.dequantize(*q.quantize_array(w, axis=axis), axis=axis))
    assert np.square(back - w).sum() < np.square(per_channel - w).sum()   # finer scales
  qw, scale = q.quantize_array(w, axis=1, group=8)
  assert np.all(np.asarray(qw)[8:16, 5] == 0) and float(scale[1, 5]) == 1.0


def test_both_forms_of_the_grouped_head_give_the_same_logits():
  """The TPU form (group partial sums of one dot, then scaled) and the scaled-table form agree,
  for several leading shapes; on this CPU `grouped_logits` takes the scaled table."""
  rng = np.random.default_rng(4)
  table = jnp.asarray(rng.integers(-127, 128, size=(96, 32)), jnp.int8)
  scale = jnp.asarray(rng.uniform(1e-3, 1e-2, size=(96, 4)), jnp.float32)
  for lead in ((1,), (3,), (2, 5)):
    hidden = jnp.asarray(rng.normal(size=lead + (32,)), jnp.float32)
    want = np.einsum("...gi,vgi,vg->...v", np.asarray(hidden).reshape(lead + (4, 8)),
                     np.asarray(table, np.float64).reshape(96, 4, 8), np.asarray(scale))
    for form in (int8_table._scaled_table_logits, int8_table._group_partial_logits,
                 int8_table.grouped_logits):
      got = jax.jit(form, static_argnums=3)(hidden, table, scale, jnp.float32)
      assert got.shape == lead + (96,) and got.dtype == jnp.float32
      np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_the_chunked_grouped_head_gives_the_same_logits(monkeypatch):
  """The TPU form for many rows (the scaled table chunk by chunk from blocks, the last chunk
  overlapping the one before) agrees with the scaled table; on this CPU `grouped_logits` reads
  a blocked table through the scaled table."""
  monkeypatch.setattr(int8_table, "CHUNK_BYTES", 64 * 32 * 4)       # 64-row chunks of V = 96
  rng = np.random.default_rng(5)
  table = jnp.asarray(rng.integers(-127, 128, size=(96, 32)), jnp.int8)
  blocks = int8_table.to_blocks(table)
  scale = jnp.asarray(rng.uniform(1e-3, 1e-2, size=(96, 4)), jnp.float32)
  assert int8_table._chunk_rows(blocks, jnp.float32) == 64
  for lead in ((1,), (40,), (2, 5)):
    hidden = jnp.asarray(rng.normal(size=lead + (32,)), jnp.float32)
    want = int8_table._scaled_table_logits(hidden, table, scale, jnp.float32)
    for form in (int8_table._chunked_logits, int8_table.grouped_logits):
      got = jax.jit(form, static_argnums=3)(hidden, blocks, scale, jnp.float32)
      assert got.shape == lead + (96,)
      np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_plain_int8_is_per_channel_as_before(model):
  w = np.random.default_rng(2).standard_t(3, size=(64, 40)).astype(np.float32)
  for axis in (1, 0):
    qw, scale = q.quantize_array(w, axis=axis)
    want_q, want_scale = _per_channel_reference(w, axis)
    np.testing.assert_array_equal(np.asarray(qw), want_q)
    np.testing.assert_array_equal(np.asarray(scale), want_scale)
  cfg, params = model
  plain = q.apply_mode(params, cfg, "int8")
  again = q.quantize_params(params, cfg)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(again)))
  kernel = params["base"]["layers_0"]["mlp"]["down_proj"]["kernel"]
  np.testing.assert_array_equal(plain["base"]["layers_0"]["mlp"]["down_proj"]["kernel"],
                                q.quantize_array(kernel, 1)[0])
  assert all(x.ndim == 1 for p, x in jax.tree_util.tree_flatten_with_path(plain)[0]
             if jax.tree_util.keystr(p).endswith("_scale']"))


def test_grouped_params_layout_bytes_and_a_bad_group(model):
  cfg, params = model
  grouped = q.apply_mode(params, cfg, "int8:16")
  assert _paths(grouped, jnp.int8) == _paths(q.quantize_params(params, cfg), jnp.int8)
  down = grouped["base"]["layers_0"]["mlp"]["down_proj"]
  assert down["kernel"].shape == (128, 64) and down["kernel_scale"].shape == (8, 64)
  assert grouped["base"]["embed_tokens"]["embedding_scale"].shape == (256, 4)
  scales = sum(x.size * 4 for p, x in jax.tree_util.tree_flatten_with_path(grouped)[0]
               if jax.tree_util.keystr(p).endswith("_scale']") and x.ndim == 2)
  plain = q.quantize_params(params, cfg)
  plain_scales = sum(x.size * 4 for p, x in jax.tree_util.tree_flatten_with_path(plain)[0]
                     if jax.tree_util.keystr(p).endswith("_scale']") and x.ndim == 1)
  assert q.weight_bytes(grouped) - q.weight_bytes(plain) == scales - plain_scales > 0
  again = q.apply_mode(grouped, cfg, "int8:16")                    # idempotent
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(grouped)))
  with pytest.raises(q.QuantizeError, match=r"^quantize int8:48: G=48 does not divide 64, the "
                     r"contracted width of base/embed_tokens/embedding \[256, 64\]; use a G that "
                     r"divides 64, e.g. int8:32\.$"):
    q.apply_mode(params, cfg, "int8:48")


def test_grouped_dense_is_the_dequantized_float_dense():
  rng = np.random.default_rng(3)
  kernel = rng.standard_normal((32, 24)).astype(np.float32)
  x = rng.standard_normal((2, 5, 32)).astype(np.float32)
  bias = rng.standard_normal(24).astype(np.float32)
  qk, scale = q.quantize_array(kernel, axis=1, group=8)
  assert scale.shape == (4, 24)
  dense = q.Dense(24, use_bias=True)
  got = dense.apply({"params": {"kernel": qk, "kernel_scale": scale, "bias": bias}}, x)
  want = dense.apply({"params": {"kernel": q.dequantize(qk, scale, axis=1), "bias": bias}}, x)
  assert got.shape == (2, 5, 24)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_grouped_embedding_lookup_and_head():
  rng = np.random.default_rng(4)
  table = rng.standard_normal((40, 32)).astype(np.float32)
  qt, scale = q.quantize_array(table, axis=0, group=8)
  assert scale.shape == (40, 4)
  deq = q.dequantize(qt, scale, axis=0)
  embed = q.Embed(40, 32)
  grouped = {"params": {"embedding": qt, "embedding_scale": scale}}
  tokens = jnp.array([[0, 7, 39], [3, 3, 1]])
  np.testing.assert_array_equal(embed.apply(grouped, tokens), jnp.take(deq, tokens, axis=0))
  h = rng.standard_normal((2, 3, 32)).astype(np.float32)
  got = embed.apply(grouped, h, method=q.Embed.attend)
  np.testing.assert_allclose(got, h @ np.asarray(deq).T, rtol=1e-5, atol=1e-5)
  rows = jnp.array([0, 5, 39])
  base = {"embed_tokens": {"embedding": qt, "embedding_scale": scale}}
  np.testing.assert_array_equal(q.head_rows(base, rows, tied=True, dtype=jnp.float32),
                                deq[np.asarray(rows)])
  kernel_q, kernel_scale = q.quantize_array(table.T, axis=1, group=8)     # untied [D, V]
  untied = {"lm_head": {"kernel": kernel_q, "kernel_scale": kernel_scale}}
  np.testing.assert_array_equal(q.head_rows(untied, rows, tied=False, dtype=jnp.float32),
                                q.dequantize(kernel_q, kernel_scale, axis=1).T[np.asarray(rows)])


def test_grouped_llama_logits_match_the_dequantized_model():
  cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=4, num_kv_heads=2, head_dim=8)
  params = init_llama_params(cfg, jax.random.PRNGKey(0))
  grouped = q.apply_mode(params, cfg, "int8:8")
  deq = _dequantized(grouped)
  tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6)
  model = LlamaModel(cfg)
  out = model.apply({"params": grouped}, tokens)
  ref = model.apply({"params": deq}, tokens)
  np.testing.assert_allclose(out.logits, ref.logits, rtol=1e-4, atol=1e-5)
  hidden = out.hidden[:, -1]                                    # the decoding head, [R, D]
  logits = lambda p: model.apply({"params": p}, hidden, decoding=True, method=LlamaModel.logits)
  np.testing.assert_allclose(logits(grouped), logits(deq), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_grouped_decoding_compiles_once_and_is_the_dequantized_models():
  # pylint: disable=g-import-not-at-top
  from hamburger_jax.decode import loop as lp
  from hamburger_jax.decode.sampler import DecodeInputError, Sampler
  cfg = tiny_config(2)
  params = random_params(cfg, seed=0)
  prompts = [np.random.default_rng(i).integers(0, 256, 5).tolist() for i in range(3)]
  kw = dict(cache_length=32, out_length=32)
  sampler = Sampler(cfg, params, quantize="int8:16", **kw)
  assert sampler.params["base"]["embed_tokens"]["embedding_scale"].shape == (256, 4)
  first = sampler.decode(prompts, max_new_tokens=12)
  traces = dict(lp.TRACE_COUNTS)
  again = sampler.decode(prompts, max_new_tokens=12, confidence=0.5, temperature=0.0, seed=3)
  assert dict(lp.TRACE_COUNTS) == traces and again.compile_s == 0.0
  floats = Sampler(cfg, _dequantized(q.apply_mode(params, cfg, "int8:16")), **kw)
  assert not q.is_quantized(floats.params)
  assert first.tokens == floats.decode(prompts, max_new_tokens=12).tokens
  base = Sampler(cfg, params, base=True, quantize="int8:16", **kw)
  base_floats = Sampler(cfg, _dequantized(q.apply_mode(params, cfg, "int8:16")), base=True, **kw)
  assert (base.decode(prompts, max_new_tokens=12).tokens
          == base_floats.decode(prompts, max_new_tokens=12).tokens)
  with pytest.raises(DecodeInputError, match="G=24 does not divide 64"):
    Sampler(cfg, params, quantize="int8:24", **kw)


# Zero points ("int8:Gz").

def _q4_1_blocks(rows: int, cols: int, seed: int = 0):
  """A kernel [rows, cols] as GGUF's Q4_1 stores one: per block of 32 inputs of an output column,
  w = d * q + m, q in 0..15 (both ends used), d and m float16."""
  rng = np.random.default_rng(seed)
  codes = rng.integers(0, 16, (rows // 32, 32, cols))
  codes[:, 0], codes[:, 1] = 0, 15
  d = rng.uniform(0.001, 0.02, (rows // 32, 1, cols)).astype(np.float16).astype(np.float32)
  m = rng.uniform(-0.15, 0.0, (rows // 32, 1, cols)).astype(np.float16).astype(np.float32)
  return (codes * d + m).reshape(rows, cols).astype(np.float32)


def test_zero_points_round_trip_4bit_blocks_exactly():
  w = _q4_1_blocks(64, 24)
  qw, scale, zero = q.quantize_array(w, axis=1, group=32, zero=True)
  assert qw.dtype == jnp.int8 and scale.shape == zero.shape == (2, 24)
  back = np.asarray(q.dequantize(qw, scale, axis=1, zero=zero))
  assert np.abs(back - w).max() <= 1e-6 * np.abs(w).max()
  symmetric = np.asarray(q.dequantize(*q.quantize_array(w, axis=1, group=32), axis=1))
  assert np.abs(symmetric - w).max() > 100 * np.abs(back - w).max()     # no zero point: rounded
  t = np.random.default_rng(2).standard_normal((64, 24)).astype(np.float32)   # any weights:
  qt, st, zt = q.quantize_array(t, axis=1, group=32, zero=True)               # within a step
  back_t = np.asarray(q.dequantize(qt, st, axis=1, zero=zt))
  assert np.all(np.abs(back_t - t) <= np.repeat(np.asarray(st), 32, axis=0) / 2 + 1e-6)


def test_zero_point_dense_and_untied_head_are_the_dequantized_floats():
  rng = np.random.default_rng(4)
  kernel = rng.standard_normal((32, 24)).astype(np.float32)
  x = rng.standard_normal((2, 5, 32)).astype(np.float32)
  qk, scale, zero = q.quantize_array(kernel, axis=1, group=8, zero=True)
  dense = q.Dense(24, use_bias=False)
  got = dense.apply({"params": {"kernel": qk, "kernel_scale": scale, "kernel_zero": zero}}, x)
  want = dense.apply({"params": {"kernel": q.dequantize(qk, scale, axis=1, zero=zero)}}, x)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  head = {"lm_head": {"kernel": qk, "kernel_scale": scale, "kernel_zero": zero}}
  rows = jnp.array([3, 0, 23])
  np.testing.assert_allclose(q.head_rows(head, rows, tied=False, dtype=jnp.float32),
                             np.asarray(q.dequantize(qk, scale, axis=1, zero=zero))[:, rows].T,
                             rtol=1e-6, atol=1e-6)


def test_zero_point_params_layout_and_model_logits():
  cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=4, num_kv_heads=2, head_dim=8)
  params = init_llama_params(cfg, jax.random.PRNGKey(0))
  zp = q.apply_mode(params, cfg, "int8:8z")
  mlp = zp["layers_0"]["mlp"]["up_proj"]
  assert mlp["kernel"].dtype == jnp.int8 and mlp["kernel_zero"].shape == (4, 64)
  assert q.KERNEL_ZERO not in str(jax.tree_util.tree_structure(zp["embed_tokens"]))
  model = LlamaModel(cfg)
  tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6)
  out = model.apply({"params": zp}, tokens)
  ref = model.apply({"params": _dequantized(zp)}, tokens)
  np.testing.assert_allclose(out.logits, ref.logits, rtol=1e-4, atol=1e-5)
