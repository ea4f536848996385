"""Distillation: the plain sequence rebuilt from a packed batch, and the teacher's logits on it."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny
from hamburger_jax.train.loop import train_and_evaluate
from hamburger_jax.model.execution import Execution
from hamburger_jax.train.losses import hamburger_train_loss, plain_view, teacher_logits
from hamburger_jax.train.run_config import model_config
from hamburger_jax.train.setup import Setup
from hamburger_jax.model.batch import make_batch
from hamburger_jax.model.llama import LlamaModel
from hamburger_jax.train.metrics_writer import read_jsonl
from hamburger_jax.model.hamburger import HamburgerModel, init_params

EXAMPLES = [  # (prompt, response, steps); packed two per row
    ([1, 5, 6], [7, 8, 9, 10, 11], [2, 1, 2]),
    ([1], [20, 21, 22, 23], [4]),
    ([1, 30], [31, 32, 33], [1, 2]),
    ([1, 40, 41, 42], [43, 44, 45, 46, 47, 48], [3, 3]),
]


def _batch(seq_len=12):
  return make_batch(EXAMPLES, max_steps=4, seq_len=seq_len, num_rows=3)


def _segments(batch):
  """[(row, first macro index, example)] in packing order."""
  out, i = [], 0
  for r in range(batch["segment_ids"].shape[0]):
    seg = batch["segment_ids"][r]
    for s in range(1, seg.max() + 1):
      out.append((r, int(np.argmax(seg == s)), EXAMPLES[i]))
      i += 1
  return out


def test_plain_view_rebuilds_each_example():
  batch = _batch()
  plain, slot, valid = jax.tree.map(np.asarray, plain_view(
      jax.tree.map(jnp.asarray, batch), plain_len=48))
  offsets = {}
  for r, m0, (prompt, response, steps) in _segments(batch):
    seq = prompt + response
    start = offsets.get(r, 0)
    np.testing.assert_array_equal(plain["tokens"][r, start:start + len(seq)], seq)
    np.testing.assert_array_equal(plain["positions"][r, start:start + len(seq)],
                                  np.arange(len(seq)))
    offsets[r] = start + len(seq)
  # Slot + 1 holds the target token: the teacher's prediction at `slot` is for that token.
  rows, ms, js = np.nonzero(valid)
  assert len(rows) == sum(len(e[1]) for e in EXAMPLES)
  np.testing.assert_array_equal(plain["tokens"][rows, slot[rows, ms, js] + 1],
                                batch["target_tokens"][rows, ms, js])


def test_plain_view_masks_what_does_not_fit():
  batch = jax.tree.map(jnp.asarray, _batch())
  _, slot, valid = plain_view(batch, plain_len=6)
  assert 0 < int(valid.sum()) < sum(len(e[1]) for e in EXAMPLES)
  assert bool(jnp.all(jnp.where(valid, slot < 6, True)))   # inputs up to the slot fit


def test_teacher_logits_match_the_base_model_on_plain_sequences():
  c = tiny.get_config()
  cfg = model_config(c)
  params = init_params(cfg, jax.random.PRNGKey(0))
  batch = jax.tree.map(jnp.asarray, _batch())
  logits, valid = jax.jit(teacher_logits, static_argnums=(0, 3))(
      cfg.base, params["base"], batch, 48)
  student = jax.jit(HamburgerModel(cfg).apply)({"params": params}, batch)
  plain = np.zeros((len(EXAMPLES), 16), np.int32)       # each example alone, end-padded
  for i, (prompt, response, _) in enumerate(EXAMPLES):
    plain[i, :len(prompt) + len(response)] = prompt + response
  refs = jax.jit(LlamaModel(cfg.base).apply)({"params": params["base"]}, plain).logits
  for e, (r, m0, (prompt, response, steps)) in enumerate(_segments(batch)):
    ref = refs[e]
    t = len(prompt)
    first = m0 + t - 1                   # macro position of the last prompt token
    for i in range(len(response)):       # response token i, predicted at plain index t - 1 + i
      g = int(np.searchsorted(np.cumsum(steps), i, side="right"))
      j = i - int(np.concatenate([[0], np.cumsum(steps)])[g])
      assert valid[r, first + g, j]
      np.testing.assert_allclose(logits[r, first + g, j], ref[t - 1 + i], atol=1e-4, rtol=1e-4)
    # Micro step 0 at the last prompt token IS the base model there: zero KL to the teacher.
    np.testing.assert_allclose(student.logits[r, first, 0], ref[t - 1], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_training_with_distillation_keeps_the_teacher_frozen(tmp_path):
  c = tiny.get_config()
  c.update_from_flattened_dict({"num_train_steps": 3, "loss.kl_weight": 0.5,
                                "logging.every_steps": 1, "eval.every_steps": 3,
                                "checkpoint.every_steps": 3, "checkpoint.export": False,
                                "logging.progress_bar": False, "logging.tensorboard": False})
  state = train_and_evaluate(c, str(tmp_path))
  rows = [r for r in read_jsonl(str(tmp_path)) if "train/kl" in r]
  assert len(rows) == 3 and all(np.isfinite(r["train/kl"]) and r["train/kl"] > 0 for r in rows)
  assert any("eval/kl" in r for r in read_jsonl(str(tmp_path)))
  setup = Setup(c, model_config(c),
                          state.params["base"]["norm"]["scale"].sharding.mesh)
  start = setup.init_state()
  for t, s0, p in zip(jax.tree.leaves(state.teacher), jax.tree.leaves(start.params["base"]),
                      jax.tree.leaves(state.params["base"])):
    np.testing.assert_array_equal(np.asarray(t), np.asarray(s0))
    assert not np.array_equal(np.asarray(p), np.asarray(s0))


def test_kl_on_gathered_target_positions_equals_kl_on_all_positions():
  c = tiny.get_config()
  c.loss.kl_weight = 0.5
  cfg = model_config(c)
  params = init_params(cfg, jax.random.PRNGKey(0))
  batch = jax.tree.map(jnp.asarray, _batch())
  most = int((batch["target_lengths"] > 0).sum(1).max())
  assert most < batch["target_lengths"].shape[1]          # gathering really drops positions

  def metrics(max_targets):
    fn = functools.partial(hamburger_train_loss, cfg, c.loss, 48, max_targets, Execution())
    return jax.jit(fn)(params, batch, None)[1]

  full, gathered = metrics(None), metrics(most)
  for name in ("kl", "loss", "label_loss", "stop_loss"):
    np.testing.assert_allclose(gathered[name], full[name], rtol=1e-5, err_msg=name)
  assert float(full["kl"]) > 0
