"""Properties of the HAMburger model: embedder, packing, cached vs full forwards, presets."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hamburger_jax.model.kv_cache import init_cache
from hamburger_jax.model.batch import make_batch
from hamburger_jax.model.config import get_preset
from hamburger_jax.model.hamburger import HamburgerModel, init_params, param_count
from tests import compiled

CFG = get_preset("tiny")
MODEL = HamburgerModel(CFG)
V, S = CFG.base.vocab_size, CFG.max_steps


@functools.cache
def tiny_params():
  """The tiny preset's params (made on first use, not while tests are collected)."""
  return init_params(CFG, jax.random.PRNGKey(0))


def apply(method, *args, **kw):
  return compiled.apply(MODEL, {"params": tiny_params()}, *args, method=method, **kw)


def random_params_nonzero_bias():
  # Zero-initialised biases would hide bias bugs: perturb every leaf.
  leaves, tree = jax.tree_util.tree_flatten(tiny_params())
  keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
  return jax.tree_util.tree_unflatten(
      tree, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def test_group_of_one_is_plain_embedding():
  tokens = jnp.array([[5, 9, 9, 9], [7, 0, 0, 0]])
  merged = apply(HamburgerModel.embed_groups, tokens, jnp.array([1, 1]))
  plain = tiny_params()["base"]["embed_tokens"]["embedding"][tokens[:, 0]]
  np.testing.assert_array_equal(np.asarray(merged), np.asarray(plain))


@pytest.mark.slow
def test_padding_beyond_group_length_changes_nothing():
  params = random_params_nonzero_bias()
  rng = np.random.RandomState(0)
  for length in range(2, S + 1):
    a = rng.randint(3, V, (S,))
    b = a.copy()
    b[length:] = rng.randint(3, V, (S - length,))
    out = compiled.apply(MODEL, {"params": params}, jnp.stack([a, b]), jnp.array([length, length]),
                         method=HamburgerModel.embed_groups)
    np.testing.assert_allclose(out[0], out[1], atol=1e-6)
    # ...while the tokens inside the group do matter.
    c = a.copy()
    c[0] = (c[0] + 1) % V
    out_c = compiled.apply(MODEL, {"params": params}, jnp.array(c)[None], jnp.array([length]),
                           method=HamburgerModel.embed_groups)
    assert np.abs(np.asarray(out_c[0] - out[0])).max() > 1e-4


def _examples(rng, n):
  out = []
  for _ in range(n):
    prompt = rng.randint(3, V, rng.randint(1, 6))
    steps = rng.randint(1, S + 1, rng.randint(1, 5))
    out.append((prompt, rng.randint(3, V, steps.sum()), steps))
  return out


@pytest.mark.slow
def test_packed_rows_equal_one_example_per_row():
  params = random_params_nonzero_bias()
  examples = _examples(np.random.RandomState(2), 5)
  packed = make_batch(examples, S, seq_len=64)
  single = make_batch(examples, S, seq_len=64, pack=False)
  assert packed["group_tokens"].shape[0] < len(examples)   # really packed
  run = lambda b: compiled.apply(MODEL, {"params": params}, jax.tree_util.tree_map(jnp.asarray, b))
  out_p, out_s = run(packed), run(single)
  pick = lambda b, x: np.asarray(x)[np.arange(S) < b["target_lengths"][..., None]]
  np.testing.assert_allclose(pick(packed, out_p.logits), pick(single, out_s.logits), atol=2e-5)
  np.testing.assert_allclose(pick(packed, out_p.stop_logits), pick(single, out_s.stop_logits),
                             atol=2e-5)


@pytest.mark.slow
def test_cached_base_forward_equals_full_forward():
  """Prefill then one macro input at a time through the KV cache == one full forward."""
  rng = np.random.RandomState(3)
  groups = rng.randint(3, V, (2, 10, S))
  lengths = rng.randint(1, S + 1, (2, 10))
  positions = np.cumsum(lengths, axis=1) - 1
  full = apply(HamburgerModel.base_forward, groups, lengths, positions, jnp.ones((2, 10), int))
  cached = jax.jit(lambda g, n, p, cache, slots: apply(HamburgerModel.base_forward, g, n, p,
                                                       cache=cache, cache_slots=slots))
  cache = init_cache(CFG.base, CFG.base.num_layers, 2, 16)
  out = cached(groups[:, :6], lengths[:, :6], positions[:, :6], cache, jnp.zeros(2, jnp.int32))
  feats = [out.features]
  cache = out.cache
  for t in range(6, 10):
    out = cached(groups[:, t:t + 1], lengths[:, t:t + 1], positions[:, t:t + 1], cache,
                 jnp.full((2,), t, jnp.int32))
    cache = out.cache
    feats.append(out.features)
  np.testing.assert_allclose(np.concatenate(feats, 1), full.features, atol=1e-5)


def _teacher_forced(model, feats, embeddings):
  return model.micro_decoder.teacher_forced(feats, embeddings)


@pytest.mark.slow
def test_micro_step_mode_equals_teacher_forced():
  rng = np.random.RandomState(4)
  feats = jnp.asarray(rng.randn(3, CFG.num_features, CFG.base.hidden_size).astype(np.float32))
  tokens = rng.randint(3, V, (3, S))
  emb = tiny_params()["base"]["embed_tokens"]["embedding"][tokens[:, :S - 1]]
  tf = compiled.apply(MODEL, {"params": tiny_params()}, feats, emb, method=_teacher_forced)
  cache = apply(HamburgerModel.micro_prefill, feats)
  outs = [feats[:, -1]]
  for j in range(1, S):
    h, cache = apply(HamburgerModel.micro_step, jnp.asarray(tokens[:, j - 1]), j, cache)
    outs.append(h)
  np.testing.assert_allclose(np.stack(outs, 1), tf, atol=1e-5)
  # The prefill and step 1 fused into one pass (verified drafting) give step 1 and the cache.
  first, fused_cache = apply(HamburgerModel.micro_prefill_step, feats, jnp.asarray(tokens[:, 0]))
  np.testing.assert_allclose(first, tf[:, 1], atol=1e-5)
  h, _ = apply(HamburgerModel.micro_step, jnp.asarray(tokens[:, 1]), 2, fused_cache)
  np.testing.assert_allclose(h, tf[:, 2], atol=1e-5)


def test_llama3_1b_preset_parameter_count():
  cfg = get_preset("llama3.2-1b")
  shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
  base = param_count(shapes["base"])
  grafted = param_count(shapes) - base
  assert 1.235e9 < base < 1.237e9, base          # Llama-3.2-1B: 1,235,814,400
  assert grafted == param_count(shapes["embedder"]) + param_count(shapes["micro_decoder"])
  assert shapes["embedder"]["pos"].shape == (4, 1024)
  assert shapes["embedder"]["k_proj"]["kernel"].shape == (3072, 2048)


@pytest.mark.slow
def test_bf16_compute():
  cfg = CFG.replace(base=dataclasses.replace(CFG.base, dtype="bfloat16"))
  batch = make_batch(_examples(np.random.RandomState(5), 2), S, seq_len=32)
  batch = jax.tree_util.tree_map(jnp.asarray, batch)
  out = compiled.apply(HamburgerModel(cfg), {"params": tiny_params()}, batch)
  ref = compiled.apply(MODEL, {"params": tiny_params()}, batch)
  assert out.micro_outputs.dtype == jnp.bfloat16 and out.logits.dtype == jnp.float32
  keep = np.arange(S) < batch["target_lengths"][..., None]
  err = np.abs(np.asarray(out.logits)[keep] - np.asarray(ref.logits)[keep]).max()
  assert err < 0.05 * np.abs(np.asarray(ref.logits)[keep]).max()


@pytest.mark.slow
def test_params_carry_logical_axes():
  import flax.linen as nn
  boxed = init_params(CFG, jax.random.PRNGKey(0), boxed=True)
  specs = nn.get_partition_spec(boxed)
  assert tuple(specs["base"]["embed_tokens"]["embedding"]) == ("vocab", "embed")
  assert tuple(specs["base"]["layers_0"]["self_attn"]["k_proj"]["kernel"]) == ("embed", "kv_heads")
  assert tuple(specs["micro_decoder"]["layers_0"]["mlp"]["down_proj"]["kernel"]) == ("mlp", "embed")
  leaves = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  assert all(all(a is not None for a in spec) for spec in leaves)


@pytest.mark.slow
def test_gathered_targets_give_the_same_loss():
  from hamburger_jax.train.losses import hamburger_loss
  examples = _examples(np.random.RandomState(6), 4)
  batch = jax.tree_util.tree_map(jnp.asarray, make_batch(examples, S, seq_len=40))
  most = int((batch["target_lengths"] > 0).sum(1).max())
  full = compiled.apply(MODEL, {"params": tiny_params()}, batch)
  part = compiled.apply(MODEL, {"params": tiny_params()}, batch, max_targets=most)
  assert part.logits.shape[1] == most < full.logits.shape[1]
  loss = lambda o: hamburger_loss(o.logits, o.stop_logits, o.target_tokens, o.target_lengths)
  (l_full, m_full), (l_part, m_part) = loss(full), loss(part)
  np.testing.assert_allclose(l_part, l_full, rtol=1e-5)
  assert float(m_part["tokens"]) == float(m_full["tokens"])


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 12, 32])
@pytest.mark.slow
def test_decoding_heads_equal_the_training_heads(rows):
  """The decode-time LM head (a multiply and sum over D at 2-32 rows on CPU) is the same product."""
  from hamburger_jax.model import layers
  hidden = jax.random.normal(jax.random.PRNGKey(rows), (rows, CFG.base.hidden_size))
  train_logits, train_stop = apply(HamburgerModel.heads, hidden)
  logits, stop = apply(HamburgerModel.heads, hidden, decoding=True)
  assert logits.shape == (rows, V) and logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, train_logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(stop, train_stop)
  table = tiny_params()["base"]["embed_tokens"]["embedding"]
  rowwise = layers.attend_rows(hidden, table)
  np.testing.assert_allclose(rowwise, hidden @ table.T, rtol=1e-5, atol=1e-5)
  # bfloat16 keeps the plain dot (a multiply and sum would add in bfloat16).
  half = layers.attend_rows(hidden.astype(jnp.bfloat16), table.astype(jnp.bfloat16))
  assert half.dtype == jnp.float32
  np.testing.assert_allclose(half, hidden @ table.T, rtol=0.05, atol=0.05)
