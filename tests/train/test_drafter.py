"""The verification drafter's cached features and training (train/drafter_features.py, drafter.py)."""

import functools

import jax
import numpy as np
import pytest

from hamburger_jax.decode.models import verify_depth
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.train import drafter
from hamburger_jax.train import drafter_features as dfe
from tests.decode.helpers import CACHE_LENGTH, OUT_LENGTH, drafting_model

PROMPTS = [[1, 5, 7], [3, 9, 11, 2, 4], [7], [8, 8, 8, 8], [100, 3], [17] * 9]


def test_valid_steps_follow_the_greedy_path_and_the_draft_vocabulary():
  teacher = np.array([[5, 6, 7, 8], [5, 9, 7, 8], [5, 6, 7, 8]])
  greedy = np.array([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 3, -1]])
  got = drafter.valid_steps(teacher, greedy, np.array([5, 6, 7, 8]))
  np.testing.assert_array_equal(got, [[0, 1, 1, 1],     # every fed token is the base's own
                                      [0, 1, 0, 0],     # x_{t+2} = 9 left the greedy path
                                      [0, 1, 0, 0]])    # 3 is not draftable, -1 past the end


def test_the_decode_walk_visits_only_the_rows_after_each_committed_token():
  # Answer 1 (6 tokens): forward 1 commits token 0; row 0 accepts 2 -> tokens 1-3; row 3 accepts
  # 3 but only 1 draft is left (tokens 4, 5): 3 forwards. Answer 2 (2 tokens): row 0 accepts 0
  # -> token 1: 2 forwards. Rows 1, 2, 4, 5 of answer 1 are never visited.
  prefix = np.array([2, 0, 0, 3, 0, 0, 0, 3])
  assert drafter.decode_walk(prefix, np.array([6, 2])) == 8 / 5
  assert drafter.decode_walk(np.array([0, 0, 0]), np.array([3])) == 1.0


@functools.lru_cache(maxsize=None)
def _decoded(steps: int = 4):
  """Verified greedy answers of the drafting model, steps - 1 of the micro decoder's drafts
  proposed every forward (no lookup drafts: the cache teaches the micro decoder alone)."""
  cfg, params = drafting_model()
  sampler = Sampler(cfg, params, cache_length=CACHE_LENGTH, out_length=OUT_LENGTH, verify=True,
                    verify_steps=steps, lookup_drafts=0)
  result = sampler.decode(PROMPTS, max_new_tokens=24, confidence=0.001, min_token_prob=0.0)
  pairs = [(list(p), list(result.tokens[r])) for r, p in enumerate(PROMPTS)]
  return cfg, params, result, pairs


@pytest.mark.slow
@pytest.mark.parametrize("steps", [4, 6])
def test_cached_features_reproduce_what_verified_decoding_accepted(steps):
  """Teacher forcing on the cache drafts what the decode loop drafted: at the position each
  forward's drafts were made from, the accepted prefix equals that forward's accepted count. At a
  depth past the cached S the cache is re-cut from its own rows (`with_steps`)."""
  cfg, params, result, pairs = _decoded(steps)
  cache = dfe.with_steps(dfe.compute_features(cfg, params, pairs, log_every=0), steps)
  cfg, params = verify_depth(cfg, params, steps)
  vocab = np.arange(cfg.base.vocab_size, dtype=np.int32)
  data = drafter.prepare(cache, vocab, cfg.base.vocab_size)
  logits, _ = jax.jit(lambda f, t: drafter._outputs(cfg, params, params["micro_decoder"], vocab,
                                                     f, t))(data["features"], data["teacher"])
  hit = (np.asarray(logits).argmax(-1) == data["target_index"]) & data["valid"]
  prefix = np.cumprod(hit[:, 1:], axis=1).sum(axis=1)
  starts = np.concatenate([[0], np.cumsum(cache["answer_rows"])[:-1]])
  compared = 0
  for r, sizes in enumerate(result.group_sizes):
    ends = np.cumsum(sizes)
    for k in range(1, len(sizes) - 1):           # the last group may be cut by the budget
      row = starts[r] + ends[k - 1] - 1          # drafted at the input before the base's token
      assert prefix[row] == sizes[k] - 1, (r, k)
      compared += 1
  assert compared > 20 and 0 < sum(prefix) < (steps - 1) * len(prefix)
  # Walking the answers on the cached acceptance gives the decode loop's tokens per forward.
  decoded = sum(len(t) for t in result.tokens) / sum(result.macro_steps)
  assert drafter.decode_walk(prefix, cache["answer_rows"]) == pytest.approx(decoded, abs=1e-12)
  assert drafter.acceptance(cfg, params, vocab, data)["decoded_tokens_per_forward"] == \
      pytest.approx(decoded, abs=1e-12)


def test_a_cache_re_cut_at_its_own_depth_is_itself():
  # Two answers after their prompts: tokens 5, 6 (rows at the prompt's last token and at 5) and
  # token 9 (one row); the base's greedy tokens there are 5, 8 and 9.
  teacher = np.array([[5, 6, 0], [6, 0, 0], [9, 0, 0]], np.int32)
  greedy = np.array([[5, 8, -1], [8, -1, -1], [9, -1, -1]], np.int32)
  cache = {"teacher": teacher, "greedy": greedy, "answer_rows": np.array([2, 1], np.int32)}
  same = dfe.with_steps(cache, 3)
  np.testing.assert_array_equal(same["teacher"], teacher)
  np.testing.assert_array_equal(same["greedy"], greedy)
  deeper, shallower = dfe.with_steps(cache, 4), dfe.with_steps(cache, 2)
  np.testing.assert_array_equal(deeper["teacher"], np.pad(teacher, ((0, 0), (0, 1))))
  np.testing.assert_array_equal(deeper["greedy"], np.pad(greedy, ((0, 0), (0, 1)),
                                                         constant_values=-1))
  np.testing.assert_array_equal(shallower["greedy"], greedy[:, :2])


@pytest.mark.slow
def test_training_raises_teacher_forced_acceptance():
  cfg, params, _, pairs = _decoded()
  cache = dfe.compute_features(cfg, params, pairs, log_every=0)
  vocab = np.arange(cfg.base.vocab_size, dtype=np.int32)
  data = drafter.prepare(cache, vocab, cfg.base.vocab_size)
  before = drafter.acceptance(cfg, params, vocab, data)
  trained, history = drafter.train(cfg, params, vocab, data, steps=40, batch=32, lr=3e-3,
                                   log_every=40, log=lambda _: None)
  after = drafter.acceptance(cfg, trained, vocab, data)
  assert after["tokens_per_forward"] > before["tokens_per_forward"] + 0.1
  # Walk-weighted rows: every valid position once, the visited ones again.
  rows = drafter.walk_weighted_rows(cfg, trained, vocab, data, 3)
  valid = np.flatnonzero(data["valid"][:, 1])
  prefix = drafter.accepted_drafts(cfg, trained, vocab, data).sum(axis=1)
  visited = np.flatnonzero(drafter.walk_rows(prefix, data["answer_rows"]) & data["valid"][:, 1])
  assert 0 < len(visited) < len(valid) and len(rows) == len(valid) + 2 * len(visited)
  np.testing.assert_array_equal(np.bincount(rows, minlength=len(data["valid"]))[visited], 3)
  assert history[-1]["ce"] < np.log(cfg.base.vocab_size)
  # Only the micro decoder changed.
  same = jax.tree_util.tree_map(lambda a, b: bool(np.array_equal(a, b)),
                                {k: v for k, v in params.items() if k != "micro_decoder"},
                                {k: v for k, v in trained.items() if k != "micro_decoder"})
  assert all(jax.tree_util.tree_leaves(same))
  # The stop head alone: the drafts stay, the stop head learns.
  calibrated, _ = drafter.train(cfg, trained, vocab, data, steps=5, batch=32, lr=3e-3,
                                stop_head_only=True, log_every=5, log=lambda _: None)
  old, new = trained["micro_decoder"], calibrated["micro_decoder"]
  for name in old:
    changed = any(not np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(old[name]),
                                                          jax.tree_util.tree_leaves(new[name])))
    assert changed == (name == "stop_head"), name


@pytest.mark.slow
def test_soft_targets_are_the_base_distributions_at_the_following_positions():
  """A valid step j's soft target, read from the cached final-norm features of row t + j, is the
  base's distribution whose argmax is that step's greedy target; training on it learns."""
  cfg, params, _, pairs = _decoded()
  cache = dfe.compute_features(cfg, params, pairs, log_every=0)
  vocab = np.arange(cfg.base.vocab_size, dtype=np.int32)
  data = drafter.prepare(cache, vocab, cfg.base.vocab_size)
  final = drafter._following_final_features(data["features"], np.arange(len(data["valid"])),
                                            cfg.max_steps)
  argmax = np.asarray(drafter._draft_logits(cfg, params, vocab, final)).argmax(-1)
  valid = data["valid"][:, 1:]
  assert valid.sum() > 50
  np.testing.assert_array_equal(argmax[valid], data["target_index"][:, 1:][valid])
  before = drafter.acceptance(cfg, params, vocab, data)
  trained, history = drafter.train(cfg, params, vocab, data, steps=40, batch=32, lr=3e-3,
                                   soft_weight=0.5, log_every=40, log=lambda _: None)
  assert drafter.acceptance(cfg, trained, vocab, data)["tokens_per_forward"] > \
      before["tokens_per_forward"] + 0.1
  assert np.isfinite(history[-1]["loss"])


def test_cache_round_trips_without_pickle(tmp_path):
  cache = {"features": np.ones((3, 4, 8), np.float16), "teacher": np.zeros((3, 4), np.int32)}
  path = str(tmp_path / "c.npz")
  dfe.save_cache(path, cache)
  back = dfe.load_cache(path)
  assert set(back) == set(cache) and all(np.array_equal(back[k], cache[k]) for k in cache)
  with pytest.raises(FileNotFoundError):
    dfe.load_cache(str(tmp_path / "missing.npz"))


def test_verified_decoding_loads_the_checkpoints_verification_drafter(tmp_path):
  import jax.numpy as jnp
  from hamburger_jax.convert import CheckpointError
  from hamburger_jax.decode.checkpoint import (VERIFY_DRAFTER_FILE, open_checkpoint,
                                               verify_drafter_steps)
  from hamburger_jax.recipes.verify_drafter import export
  from hamburger_jax.testing.fixtures import make_tiny_checkpoint
  ckpt = make_tiny_checkpoint(str(tmp_path / "tiny"))
  merged = open_checkpoint(ckpt, token_ids=True)
  assert open_checkpoint(ckpt, token_ids=True, verify=True).params is not None   # none: as stored
  shifted = jax.tree_util.tree_map(lambda x: x + 0.5, merged.params["micro_decoder"])
  export(str(tmp_path / "tiny" / VERIFY_DRAFTER_FILE), shifted, {"how": "a test"})
  verified = open_checkpoint(ckpt, token_ids=True, verify=True)
  assert verified.verify_steps is None                 # none recorded: the model's own S
  want = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.bfloat16).astype(x.dtype), shifted)
  for a, b in zip(jax.tree_util.tree_leaves(verified.params["micro_decoder"]),
                  jax.tree_util.tree_leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  same = open_checkpoint(ckpt, token_ids=True)          # merged decoding keeps its own
  for a, b in zip(jax.tree_util.tree_leaves(same.params["micro_decoder"]),
                  jax.tree_util.tree_leaves(merged.params["micro_decoder"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert same.verify_steps is None
  export(str(tmp_path / "tiny" / VERIFY_DRAFTER_FILE), shifted, {"verify_steps": 6})
  assert verify_drafter_steps(str(tmp_path / "tiny")) == 6
  assert open_checkpoint(ckpt, token_ids=True, verify=True).verify_steps == 6
  export(str(tmp_path / "tiny" / VERIFY_DRAFTER_FILE),
         {"layers_0": shifted["stop_head"]}, {"how": "wrong layers"})
  with pytest.raises(CheckpointError, match="does not fit"):
    open_checkpoint(ckpt, token_ids=True, verify=True)


def test_the_recipe_refuses_training_on_held_out_answers():
  from hamburger_jax.recipes import verify_drafter
  assert verify_drafter.parse_lines("0:750") == (0, 750)
  with pytest.raises(ValueError, match="0:3000"):
    verify_drafter.parse_lines("a:b")
  with pytest.raises(ValueError, match="empty"):
    verify_drafter.parse_lines("5:5")
  assert verify_drafter.parse_ranges("0:9250,10000:16000") == [(0, 9250), (10000, 16000)]
  with pytest.raises(SystemExit, match="held-out"):
    verify_drafter.main(["--workdir", "/nonexistent", "--lines", "0:100",
                         "--calibrate_lines", "9800:9900", "--heldout_lines", "9750:10000"])
  with pytest.raises(SystemExit, match="held-out"):
    verify_drafter.main(["--workdir", "/nonexistent", "--lines", "0:100,9900:12000",
                         "--heldout_lines", "9750:10000"])
  with pytest.raises(SystemExit, match="must look like 0:3000"):
    verify_drafter.main(["--workdir", "/nonexistent", "--lines", "0:100,x"])


def test_a_visited_weight_below_one_is_refused_before_any_work(tmp_path):
  from hamburger_jax.recipes import verify_drafter
  with pytest.raises(SystemExit, match="--visited_weight must be >= 1"):
    verify_drafter.main(["--workdir", str(tmp_path), "--visited_weight", "0"])
  assert not (tmp_path / "features").exists()


def test_resume_without_a_trained_drafter_is_refused_before_any_work(tmp_path):
  from hamburger_jax.recipes import verify_drafter
  with pytest.raises(SystemExit, match="train once without --resume"):
    verify_drafter.main(["--workdir", str(tmp_path), "--resume", "--lines", "0:100"])
  assert not (tmp_path / "features").exists()
