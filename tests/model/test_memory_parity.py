"""Memory-saving execution choices give today's numbers: blockwise vs XLA attention, every remat
policy, the chunked loss and scanned layers (loss and gradients, float32 on CPU).

Tolerances: 2e-5 relative on losses; gradient leaves within 2e-5 of their largest entry (or of
1e-3 x the largest gradient anywhere, for leaves that are zero up to rounding).
"""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import tiny
from hamburger_jax.model.attention_ops import blockwise_attention, causal_segment_mask, xla_attention
from hamburger_jax.model.batch import make_batch
from hamburger_jax.model.execution import REMAT_POLICIES, Execution
from hamburger_jax.model.hamburger import init_params
from hamburger_jax.model.llama import scan_segments
from hamburger_jax.train.losses import make_loss_fn
from hamburger_jax.train.run_config import model_config

RTOL = 2e-5


# (base layers, feature layers, micro layers): the default, and runs of equal length between taps
# (scanned as one scan of scans) with a two-layer micro decoder.
SHAPES = {"default": (3, (0,), 1), "equal_runs": (4, (1,), 2)}


def _config(chunk=0, mode="hamburger", kl=0.0, shape="default"):
  c = tiny.get_config()
  c.mode = mode
  c.model.num_layers, c.model.feature_layers, c.model.num_micro_layers = SHAPES[shape]
  c.data.seq_len = 24
  c.loss.chunk_size = chunk
  c.loss.kl_weight = kl
  return c


def _batch(seq_len=24):
  rng = np.random.RandomState(0)
  examples = []
  for _ in range(6):
    steps = rng.randint(1, 5, rng.randint(1, 4))
    examples.append((rng.randint(3, 256, rng.randint(1, 6)), rng.randint(3, 256, steps.sum()),
                     steps))
  batch = make_batch(examples, 4, seq_len=seq_len, num_rows=2)
  assert batch["segment_ids"].max() > 1           # rows really packed
  return jax.tree.map(jnp.asarray, batch)


BATCH = _batch()


@functools.lru_cache(maxsize=None)
def _params(mode, shape="default"):
  params = init_params(model_config(_config(shape=shape)), jax.random.PRNGKey(0))
  return params if mode == "hamburger" else {"base": params["base"]}


def loss_and_grads(execution=Execution(), chunk=0, mode="hamburger", kl=0.0, shape="default"):
  c = _config(chunk, mode, kl, shape)
  loss_fn = make_loss_fn(c, model_config(c), execution)
  grad_fn = jax.jit(jax.value_and_grad(lambda p: loss_fn(p, BATCH, None)[0]))
  return grad_fn(_params(mode, shape))


def assert_same(got, ref, rtol=RTOL):
  (loss, grads), (ref_loss, ref_grads) = got, ref
  np.testing.assert_allclose(float(loss), float(ref_loss), rtol=rtol)
  leaves = [np.asarray(r) for r in jax.tree.leaves(ref_grads)]
  floor = 1e-3 * max(float(np.abs(r).max()) for r in leaves)   # leaves that are ~0 in theory
  for g, r in zip(jax.tree.leaves(grads), leaves):
    scale = max(float(np.abs(r).max()), floor)
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=rtol * scale)


@functools.lru_cache(maxsize=None)
def reference(mode="hamburger", kl=0.0, shape="default"):
  return loss_and_grads(mode=mode, kl=kl, shape=shape)


def _qkv(b=2, t=37, n=4, kh=2, h=8, seed=0):
  rng = np.random.RandomState(seed)
  q, k, v = (jnp.asarray(rng.randn(b, t, heads, h), jnp.float32) for heads in (n, kh, kh))
  seg = jnp.asarray(np.repeat([[1, 2, 3, 0], [1, 1, 2, 2]], [10, 12, 11, 4], axis=1))
  return q, k, v, seg


@pytest.mark.parametrize("block", [8, 64])      # 8: 37 keys padded to 40; 64: one block
@pytest.mark.slow
def test_blockwise_attention_equals_xla(block):
  q, k, v, seg = _qkv()
  ref_fn = lambda q, k, v: xla_attention(q, k, v, causal_segment_mask(seg))
  blk_fn = lambda q, k, v: blockwise_attention(q, k, v, seg, block)
  np.testing.assert_allclose(blk_fn(q, k, v), ref_fn(q, k, v), atol=1e-5)
  ct = jnp.asarray(np.random.RandomState(9).randn(*q.shape), jnp.float32)
  vjp = lambda f: jax.vjp(f, q, k, v)[1](ct)
  for g, r in zip(vjp(blk_fn), vjp(ref_fn)):
    np.testing.assert_allclose(g, r, atol=1e-5)


def test_blockwise_attention_keeps_packed_rows_isolated():
  q, k, v, seg = _qkv()
  out = blockwise_attention(q, k, v, seg, 8)
  # Changing the keys/values of segment 2 of row 0 (positions 10..21) leaves the others alone.
  k2 = k.at[0, 10:22].add(3.0)
  v2 = v.at[0, 10:22].add(3.0)
  out2 = blockwise_attention(q, k2, v2, seg, 8)
  untouched = np.ones(out.shape[:2], bool)
  untouched[0, 10:22] = False
  np.testing.assert_allclose(np.asarray(out2)[untouched], np.asarray(out)[untouched], atol=1e-6)
  assert np.abs(np.asarray(out2 - out)[0, 10:22]).max() > 1e-2


@pytest.mark.slow
def test_full_remat_same_loss_and_grads():
  assert_same(loss_and_grads(Execution(remat="full")), reference())


@pytest.mark.parametrize("policy", [p for p in REMAT_POLICIES if p not in ("none", "full")])
@pytest.mark.slow
def test_remat_policy_same_base_loss_and_grads(policy):     # base layers only: a faster compile
  assert_same(loss_and_grads(Execution(remat=policy), mode="base_lm"), reference("base_lm"))


@pytest.mark.slow
def test_blockwise_model_same_loss_and_grads():
  assert_same(loss_and_grads(Execution(attention="blockwise", attention_block=8)), reference())


@pytest.mark.slow
def test_chunked_loss_same_loss_and_grads():
  assert_same(loss_and_grads(chunk=10), reference())     # 24 positions: the last chunk is padded


@pytest.mark.slow
def test_chunked_distillation_and_base_lm_same_loss_and_grads():
  assert_same(loss_and_grads(chunk=8, kl=0.5), reference(kl=0.5))
  assert_same(loss_and_grads(chunk=8, mode="base_lm"), reference(mode="base_lm"))


@pytest.mark.slow
def test_scan_layers_same_loss_and_grads():
  assert scan_segments(5, (1, 2)) == [(0, 2), (2, 3), (3, 5)]
  assert scan_segments(3, (0,)) == [(0, 1), (1, 3)]
  ex = Execution(scan_layers=True, remat="full")
  assert_same(loss_and_grads(ex, chunk=8), reference())


@pytest.mark.slow
def test_scan_of_scans_same_loss_and_grads():
  """Runs of equal length (layers 0-1 | 2-3) and a scanned two-layer micro decoder."""
  ex = Execution(scan_layers=True, remat="full")
  assert_same(loss_and_grads(ex, chunk=8, shape="equal_runs"), reference(shape="equal_runs"))
  assert_same(loss_and_grads(Execution(scan_layers=True), shape="equal_runs"),
              reference(shape="equal_runs"))


def test_unknown_names_are_rejected():
  with pytest.raises(ValueError, match="remat policy 'some'"):
    Execution(remat="some")
  with pytest.raises(ValueError, match="attention 'flash'"):
    Execution(attention="flash")
  with pytest.raises(ValueError, match="needs a TPU"):
    q, k, v, seg = _qkv(t=128)
    from hamburger_jax.model.attention_ops import packed_attention
    packed_attention(q, k, v, seg, "splash")


def test_scanned_program_size_is_flat_in_depth_and_taps():
  """With scan_layers the lowered gradient program holds one base layer body and one micro layer
  body (compile time flat in depth): as many matmuls for 8 layers / 3 taps / 4 micro layers as
  for 4 layers / 1 tap / 2 micro layers; the unscanned program grows."""
  def matmuls(shape, scan):
    c = _config(chunk=8)
    c.model.num_layers, c.model.feature_layers, c.model.num_micro_layers = shape
    loss_fn = make_loss_fn(c, model_config(c), Execution(scan_layers=scan, remat="full"))
    params = jax.eval_shape(lambda: init_params(model_config(c), jax.random.PRNGKey(0)))
    grad_fn = jax.jit(jax.grad(lambda p: loss_fn(p, BATCH, None)[0]))
    return grad_fn.lower(params).as_text().count("dot_general")
  small, deep = (4, (1,), 2), (8, (1, 3, 5), 4)
  assert matmuls(small, True) == matmuls(deep, True)
  assert matmuls(deep, False) > matmuls(small, False)
