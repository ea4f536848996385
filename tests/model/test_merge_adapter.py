"""The merge adapter: identity when fresh, acts only at merged inputs, decodes consistently with
teacher forcing, keeps one-token-per-step decoding equal to the base, trains and round-trips."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hamburger_jax.convert.native import load_hamburger, save_hamburger
from hamburger_jax.decode import compaction
from hamburger_jax.decode.batching import ContinuousBatcher, Request
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.model.batch import make_batch
from hamburger_jax.model.hamburger import HamburgerModel, init_params
from hamburger_jax.testing.fixtures import random_params
from hamburger_jax.train import checkpoints, optim
from tests import compiled
from tests.decode.helpers import check_against_teacher_forcing, small_model

RANK = 8
PROMPTS = [[1, 17, 33, 250, 4], [1, 9, 3, 120, 77, 5, 6, 200, 11]]


@functools.lru_cache(maxsize=None)
def adapted_model(seed: int = 0, scale: float = 0.3):
  """(cfg, params): the small decode-test model plus a random (non-zero) merge adapter."""
  cfg, params = small_model(seed)
  cfg = cfg.replace(merge_adapter_rank=RANK)
  fresh = init_params(cfg, jax.random.PRNGKey(seed + 1))["merge_adapter"]
  keys = iter(jax.random.split(jax.random.PRNGKey(seed + 2), 4 * cfg.base.num_layers))
  adapter = jax.tree_util.tree_map(
      lambda x: scale * jax.random.normal(next(keys), x.shape) if x.ndim == 2 else x, fresh)
  return cfg, dict(params, merge_adapter=adapter)


def _features(cfg, params, sizes):
  tokens = list(range(5, 5 + sum(sizes)))
  batch = make_batch([([1, 2, 3], tokens, sizes)], cfg.max_steps, 16, pack=False)
  out = jax.jit(HamburgerModel(cfg).apply)({"params": params}, batch)
  return np.asarray(out.features[0]), np.asarray(out.logits[0]), batch


@pytest.mark.slow
def test_fresh_adapter_is_the_identity():
  cfg, params = small_model(0)
  cfg_a = cfg.replace(merge_adapter_rank=RANK)
  fresh = init_params(cfg_a, jax.random.PRNGKey(3))["merge_adapter"]
  assert all(not np.any(x) for x in jax.tree_util.tree_leaves(fresh["layers_0"]["up"]))
  f0, l0, _ = _features(cfg, params, [2, 3, 1, 4])
  f1, l1, _ = _features(cfg_a, dict(params, merge_adapter=fresh), [2, 3, 1, 4])
  np.testing.assert_array_equal(f0, f1)
  np.testing.assert_array_equal(l0, l1)


@pytest.mark.slow
def test_adapter_acts_only_at_merged_positions():
  cfg, params = small_model(0)
  cfg_a, params_a = adapted_model(0)
  sizes = [1, 1, 3, 1, 2]                 # prompt slots 0-2, groups fed at macro slots 3..6
  f0, _, batch = _features(cfg, params, sizes)
  f1, _, _ = _features(cfg_a, params_a, sizes)
  lengths = batch["group_lengths"][0]
  first_merged = int(np.argmax(lengths > 1))
  assert first_merged == 5                  # prompt (3) + two single-token groups
  np.testing.assert_array_equal(f0[:first_merged], f1[:first_merged])
  changed = np.abs(f0 - f1).max(axis=(1, 2))
  assert (changed[first_merged:int((batch["segment_ids"][0] > 0).sum())] > 1e-3).all()


@pytest.mark.slow
def test_decode_with_adapter_matches_teacher_forcing():
  cfg, params = adapted_model(0)
  sampler = Sampler(cfg, params, cache_length=32, out_length=24)
  decisions, merged = 0, 0
  for confidence in (0.2, 0.6):
    r = sampler.decode(PROMPTS, max_new_tokens=24, confidence=confidence, eos_ids=[])
    for row, prompt in enumerate(PROMPTS):
      merged += sum(s > 1 for s in r.group_sizes[row])
      decisions += check_against_teacher_forcing(cfg, params, prompt, r, row, confidence)
  assert merged > 5 and decisions > 20


@pytest.mark.slow
def test_continuous_batching_with_an_adapter_decodes_as_alone():
  cfg, params = adapted_model(0)
  sampler = Sampler(cfg, params, cache_length=32, out_length=24)
  batcher = ContinuousBatcher(cfg, params, num_slots=2, cache_length=32, chunk_steps=3)
  knobs = [(PROMPTS[0], 24, 0.2), (PROMPTS[1], 17, 0.5), (PROMPTS[0][:3], 11, 0.3)]
  done = batcher.generate([Request(p, n, c) for p, n, c in knobs])
  for c, (p, n, conf) in zip(done, knobs):
    alone = sampler.decode([p], max_new_tokens=n, confidence=conf)
    assert c.tokens == alone.tokens[0] and c.group_sizes == alone.group_sizes[0]
  assert max(max(c.group_sizes) for c in done) > 1


@pytest.mark.slow
def test_one_token_per_step_with_an_adapter_is_the_base():
  cfg, params = adapted_model(0)
  r = Sampler(cfg, params, cache_length=32, out_length=20).decode(
      PROMPTS, max_new_tokens=20, confidence=1.0, eos_ids=[])
  base = Sampler(cfg, params, base=True, cache_length=32, out_length=20).decode(
      PROMPTS, max_new_tokens=20, eos_ids=[])
  assert all(sizes == [1] * 20 for sizes in r.group_sizes)
  assert r.tokens == base.tokens


@pytest.mark.slow
def test_adapter_is_trained_and_gets_gradients():
  assert "merge_adapter" in optim.trainable_keys("hamburger", freeze_base=True)
  cfg, params = adapted_model(0)
  batch = make_batch([([1, 2, 3], list(range(5, 15)), [2, 3, 1, 4])], cfg.max_steps, 16)

  def loss(adapter):
    out = compiled.apply(HamburgerModel(cfg), {"params": dict(params, merge_adapter=adapter)},
                         batch)
    return jnp.mean(out.logits ** 2)

  grads = jax.grad(loss)(params["merge_adapter"])
  norms = [float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(grads)]
  assert min(norms) > 0


def test_export_round_trip_and_a_fresh_adapter_on_an_older_checkpoint(tmp_path):
  cfg, params = adapted_model(0)
  save_hamburger(str(tmp_path / "adapted"), cfg, params)
  cfg2, params2 = load_hamburger(str(tmp_path / "adapted"))
  assert cfg2.merge_adapter_rank == RANK
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(params2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  plain_cfg, plain = small_model(0)
  save_hamburger(str(tmp_path / "plain"), plain_cfg, plain)
  new_cfg, loaded = checkpoints.load_pretrained(str(tmp_path / "plain"), cfg, "hamburger")
  assert new_cfg.merge_adapter_rank == RANK and "merge_adapter" not in loaded
  new_cfg, _ = checkpoints.load_pretrained(str(tmp_path / "plain"), plain_cfg, "hamburger")
  assert new_cfg.merge_adapter_rank == 0



@pytest.mark.slow
def test_skipping_merge_work_when_nothing_is_merged_gives_the_same_numbers():
  """On CPU a forward with no merged input skips the embedder's merge and the adapter; rows of
  one batch still mix merged and unmerged macro steps, and every prefill is unmerged."""
  cfg, params = adapted_model(0)
  kw = dict(cache_length=32, out_length=20)
  skip = Sampler(cfg, params, skip_unmerged=True, **kw)
  full = Sampler(cfg, params, skip_unmerged=False, **kw)
  assert compaction.skips_unmerged(skip.engine)
  assert not compaction.skips_unmerged(full.engine)
  assert compaction.skips_unmerged(Sampler(cfg, params, **kw).engine)   # None: on CPU
  merged = []                       # per macro step of the single-row runs: was its input merged
  for prompts in (PROMPTS[:1], PROMPTS):
    for confidence in (0.2, 0.6):
      a = skip.decode(prompts, max_new_tokens=20, confidence=confidence, eos_ids=[])
      b = full.decode(prompts, max_new_tokens=20, confidence=confidence, eos_ids=[])
      assert a.tokens == b.tokens and a.group_sizes == b.group_sizes
      for row in range(len(prompts)):
        np.testing.assert_allclose(a.logits[row], b.logits[row], atol=1e-5)
      if len(prompts) == 1:
        merged += [s > 1 for s in a.group_sizes[0][:-1]]
  assert any(merged) and not all(merged)          # both branches ran
