"""Stop-head refit to the trust gate: targets past the group end, labels, fit, offline decode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hamburger_jax.model.batch import make_batch
from hamburger_jax.model.hamburger import HamburgerModel
from hamburger_jax.testing.fixtures import random_params, tiny_config
from hamburger_jax.train import stop_calibration as sc
from tests import compiled


def test_extended_targets_run_past_the_group_end():
  # prompt of 3, response 10..16 in groups 2, 1, 3, 1
  targets, lengths = sc.extended_targets(3, list(range(10, 17)), [2, 1, 3, 1], 4)
  assert targets.shape == (3 + 4 - 1, 4)
  np.testing.assert_array_equal(lengths, [0, 0, 4, 4, 4, 1])
  np.testing.assert_array_equal(targets[2:], [[10, 11, 12, 13], [12, 13, 14, 15],
                                              [13, 14, 15, 16], [16, 0, 0, 0]])
  assert not targets[:2].any()


def _outcomes(token, prob, target, target_len, group_len=None):
  n, s = np.shape(token)
  group_len = target_len if group_len is None else group_len
  return sc.DraftOutcomes(np.zeros((n, s, 2), np.float32), np.zeros((n, s), np.float32),
                          np.asarray(token), np.asarray(prob, np.float32), np.asarray(target),
                          np.asarray(target_len), np.zeros(n, np.int32), np.asarray(group_len))


def test_labels_need_a_kept_right_draft_and_a_reachable_step():
  o = _outcomes(token=[[5, 1, 2, 3], [5, 1, 9, 3], [5, 1, 2, 3], [5, 1, 2, 3]],
                prob=[[.1, .9, .9, .9], [.1, .9, .9, .9], [.1, .5, .9, .9], [.1, .9, .9, .9]],
                target=[[7, 1, 2, 3], [7, 1, 2, 3], [7, 1, 2, 3], [7, 1, 0, 0]],
                target_len=[4, 4, 4, 2])
  y, valid = sc.labels(o, min_token_prob=0.8)
  # all drafts right and confident: continue at 0, 1, 2 (step 0's own token does not matter)
  np.testing.assert_array_equal(y[0], [1, 1, 1, 0])
  np.testing.assert_array_equal(valid[0], [1, 1, 1, 0])
  # draft 2 wrong: stop at 1; step 2 is never reached with the teacher's context
  np.testing.assert_array_equal(y[1], [1, 0, 1, 0])
  np.testing.assert_array_equal(valid[1], [1, 1, 0, 0])
  # draft 1 right but below the gate: stop at 0, nothing after it counts
  np.testing.assert_array_equal(y[2], [0, 1, 1, 0])
  np.testing.assert_array_equal(valid[2], [1, 0, 0, 0])
  # the answer ends after 2 tokens: only the decision at 0 has a label
  np.testing.assert_array_equal(valid[3], [1, 0, 0, 0])
  y_low, _ = sc.labels(o, min_token_prob=0.4)
  assert y_low[2, 0] == 1


def test_training_targets_label_inside_the_segmentation_group_only():
  # groups of 3, 4 and 1 tokens; the extended targets run past them
  o = _outcomes(token=[[5, 1, 9, 3], [5, 1, 2, 3], [5, 1, 2, 3]],
                prob=[[.1, .2, .2, .2]] * 3,
                target=[[7, 1, 2, 3], [7, 1, 2, 3], [7, 1, 2, 3]],
                target_len=[4, 4, 4], group_len=[3, 4, 1])
  y, valid = sc.labels(o, min_token_prob=0.8, target="segments")
  np.testing.assert_array_equal(y, [[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(valid, [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
  y, valid_c = sc.labels(o, min_token_prob=0.8, target="correct")
  # row 0: the prediction of token 2 (9 vs 2) is wrong, so stop after token 1 too
  np.testing.assert_array_equal(y, [[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(valid_c, valid)
  # the gate label ignores the groups and needs the gate: no draft passes 0.8 here
  y, _ = sc.labels(o, min_token_prob=0.8, target="gate")
  assert not y.any()
  with pytest.raises(ValueError, match="Unknown stop target 'ends'"):
    sc.labels(o, min_token_prob=0.8, target="ends")


def test_readable_target_drops_groups_whose_merge_the_base_misreads():
  # one example, 3 positions in order: groups of 3, 2 and 2 tokens, all drafts right
  o = _outcomes(token=[[7, 1, 2, 3], [8, 1, 2, 3], [6, 1, 2, 3]],
                prob=[[.9] * 4] * 3,
                target=[[7, 1, 2, 3], [7, 1, 2, 3], [6, 1, 2, 3]],
                target_len=[4, 4, 4], group_len=[3, 2, 2])
  np.testing.assert_array_equal(sc.merge_read_right(o), [False, True, True])
  y_c, valid_c = sc.labels(o, min_token_prob=0.8, target="correct")
  y, valid = sc.labels(o, min_token_prob=0.8, target="readable")
  # group 0's merge is followed by a wrong step 0 (8 vs 7): it loses its continue labels;
  # group 1 is followed by a right one; group 2 is the example's last: counted as read
  np.testing.assert_array_equal(y_c, [[1, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]])
  np.testing.assert_array_equal(y, [[0, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]])
  np.testing.assert_array_equal(valid, valid_c)
  # a position of another example never reads this one's next step 0
  o2 = o._replace(example=np.asarray([0, 1, 1], np.int32))
  np.testing.assert_array_equal(sc.merge_read_right(o2), [True, True, True])


@pytest.mark.slow
def test_collect_matches_the_training_forward_inside_groups():
  cfg = tiny_config(num_layers=2)
  params = random_params(cfg, seed=1)
  rng = np.random.default_rng(0)
  examples = []
  for n in (5, 9, 3):
    steps = rng.integers(1, cfg.max_steps + 1, n).tolist()
    examples.append((rng.integers(1, cfg.base.vocab_size, 4).tolist(),
                     rng.integers(1, cfg.base.vocab_size, sum(steps)).tolist(), steps))
  out = sc.collect(cfg, params, examples, rows=2, bucket=8)
  assert out.hidden.shape == (sum(len(s) for _, _, s in examples), cfg.max_steps,
                              cfg.base.hidden_size)
  for i, ex in enumerate(examples):
    batch = make_batch([ex], cfg.max_steps, 16, pack=False)
    ref = compiled.apply(HamburgerModel(cfg), {"params": params}, batch)
    sel = np.asarray(batch["target_lengths"][0]) > 0
    lengths = np.asarray(batch["target_lengths"][0])[sel]
    mine = out.example == i
    np.testing.assert_array_equal(out.target_len[mine] >= lengths, True)
    np.testing.assert_array_equal(out.group_len[mine], lengths)
    for p, k in enumerate(lengths):      # inside the group the targets (and outputs) coincide
      np.testing.assert_allclose(out.hidden[mine][p, :k], np.asarray(ref.micro_outputs[0][sel][p, :k]),
                                 atol=2e-5)
      np.testing.assert_allclose(out.stop[mine][p, :k], np.asarray(ref.stop_logits[0][sel][p, :k]),
                                 atol=2e-5)
      np.testing.assert_array_equal(out.target[mine][p, :k], np.asarray(batch["target_tokens"][0])[sel][p, :k])
    logits = np.asarray(ref.logits[0][sel])
    np.testing.assert_array_equal(out.token[mine][:, 0], logits[:, 0].argmax(-1))


def test_fit_learns_a_separable_label_and_keeps_the_best_validation_point():
  cfg = tiny_config(num_layers=2)
  d = cfg.base.hidden_size
  rng = np.random.default_rng(0)
  hidden = rng.normal(size=(600, cfg.max_steps, d)).astype(np.float32)
  w = rng.normal(size=(d,))
  y = (hidden @ w > 0).astype(np.float32)
  valid = np.ones_like(y, bool)
  val_mask = np.arange(600) >= 500
  stop_params = random_params(cfg, seed=0)["micro_decoder"]["stop_head"]
  fitted, report = sc.fit(cfg, stop_params, hidden, y, valid, val_mask, steps=400,
                          learning_rate=1e-3, batch_size=256, eval_every=50)
  assert report.val_bce_after < 0.5 * report.val_bce_before
  assert report.train_samples == 500 * cfg.max_steps and report.val_samples == 100 * cfg.max_steps
  logits = sc.stop_logits(cfg, fitted, hidden[500:])
  assert np.mean((logits < 0) == (y[500:] == 1)) > 0.85        # continue where y = 1
  with pytest.raises(ValueError, match="validation samples"):
    sc.fit(cfg, stop_params, hidden, y, valid, np.zeros(600, bool), steps=1)


def test_simulate_counts_tokens_micro_steps_and_wrong_drafts():
  o = _outcomes(token=[[5, 1, 2, 3], [5, 1, 9, 3], [5, 1, 2, 3]],
                prob=[[.1, .9, .9, .5], [.1, .9, .9, .9], [.1, .9, .9, .9]],
                target=[[7, 1, 2, 3], [7, 1, 2, 3], [7, 1, 2, 3]], target_len=[4, 4, 4])
  go, stop = -5.0, 5.0                               # logits: continue-probability ~1 / ~0
  stop_logits = np.array([[go, go, go, go], [go, go, stop, go], [stop, go, go, go]])
  got = sc.simulate(stop_logits, o, confidence=0.5, min_token_prob=0.8)
  # row 0: drafts 1, 2 kept, draft 3 dropped by the gate (3 tokens, 3 micro steps)
  # row 1: drafts 1, 2 kept (2 wrong), then the stop head ends it (3 tokens, 2 micro steps)
  # row 2: the stop head ends it at 0 (1 token, no micro step)
  assert got["tokens_per_step"] == pytest.approx(7 / 3)
  assert got["micro_steps_per_step"] == pytest.approx(5 / 3)
  assert got["wrong_drafts_per_step"] == pytest.approx(1 / 3)
  assert got["kept_per_micro_step"] == pytest.approx(4 / 5)
