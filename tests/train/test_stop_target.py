"""Stop-head targets: the segmentation alone vs. also where the next micro prediction is wrong."""

import jax.numpy as jnp
import numpy as np
import pytest

from hamburger_jax.train import losses


def test_segments_target_marks_the_group_end_only():
  lengths = jnp.array([[3, 1, 0]])
  correct = jnp.zeros((1, 3, 4))
  got = losses.stop_targets_from(lengths, correct, "segments")
  np.testing.assert_array_equal(got[0], [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


def test_correct_target_stops_before_a_wrong_prediction():
  lengths = jnp.array([[4, 4, 2]])
  correct = jnp.array([[[1, 1, 0, 1],     # token 3 wrong -> stop after token 2
                        [1, 1, 1, 1],     # all right -> only the group end
                        [1, 0, 0, 0]]], jnp.float32)   # token 2 wrong -> stop after token 1 (the end: 2)
  got = losses.stop_targets_from(lengths, correct, "correct")
  np.testing.assert_array_equal(got[0], [[0, 1, 0, 1], [0, 0, 0, 1], [1, 1, 0, 0]])
  # Never more than "segments" outside a group, never less inside.
  seg = losses.stop_targets_from(lengths, correct, "segments")
  assert bool(jnp.all(got >= seg))


def test_loss_uses_the_chosen_target():
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(1, 2, 4, 11)), jnp.float32)
  stop_logits = jnp.asarray(rng.normal(size=(1, 2, 4)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 11, size=(1, 2, 4)), jnp.int32)
  lengths = jnp.array([[4, 3]])
  _, seg = losses.hamburger_loss(logits, stop_logits, targets, lengths, stop_target="segments")
  _, cor = losses.hamburger_loss(logits, stop_logits, targets, lengths, stop_target="correct")
  assert float(cor["stop_target_rate"]) > float(seg["stop_target_rate"])   # random logits: wrong
  assert float(cor["label_loss"]) == float(seg["label_loss"])
  assert float(cor["stop_loss"]) != float(seg["stop_loss"])


def test_unknown_target_is_refused():
  with pytest.raises(ValueError, match="loss.stop_target must be one of"):
    losses.stop_targets_from(jnp.array([[1]]), jnp.ones((1, 1, 4)), "sometimes")


def test_step_weights_reweight_the_label_loss_per_micro_step():
  rng = np.random.default_rng(1)
  stats = {"ce": jnp.asarray(rng.uniform(0.1, 3.0, size=(2, 3, 4)), jnp.float32),
           "correct": jnp.zeros((2, 3, 4))}
  stop_logits = jnp.zeros((2, 3, 4))
  lengths = jnp.array([[4, 2, 0], [1, 3, 4]])
  mask = np.arange(4) < np.asarray(lengths)[..., None]
  ce = np.asarray(stats["ce"])
  plain, m_plain = losses.hamburger_loss_from_stats(stats, stop_logits, lengths)
  w = (4.0, 1.0, 1.0, 1.0)
  weighted, m_w = losses.hamburger_loss_from_stats(stats, stop_logits, lengths, step_weights=w)
  expect = (ce * np.asarray(w) * mask).sum() / (np.asarray(w) * mask).sum()
  np.testing.assert_allclose(float(weighted - 0.5 * m_w["stop_loss"]), expect, rtol=1e-5)
  # equal weights are the plain mean; the reported label loss is unweighted either way
  same, _ = losses.hamburger_loss_from_stats(stats, stop_logits, lengths, step_weights=(2,) * 4)
  np.testing.assert_allclose(float(same), float(plain), rtol=1e-6)
  assert float(m_w["label_loss"]) == float(m_plain["label_loss"])


@pytest.mark.parametrize("spec", ["4,1,1", "a,b,c,d", "-1,1,1,1", "0,0,0,0"])
def test_bad_step_weights_are_refused(spec):
  with pytest.raises(ValueError, match="loss.step_weights must be 4 comma-separated"):
    losses.parse_step_weights(spec, 4)


def test_step_weights_parse():
  assert losses.parse_step_weights("", 4) is None
  assert losses.parse_step_weights("4,1,1,1", 4) == (4.0, 1.0, 1.0, 1.0)
