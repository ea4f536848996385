"""Training faults (issue cases 1, 2, 4, 5) on the tiny config: corrupt or truncated checkpoints,
non-finite states, another model on the same workdir, bad workdirs and settings, the packer,
signals; each one gets the right behaviour or one clear message."""

import logging
import os
import shutil
import signal
import subprocess

import jax
import ml_collections
import numpy as np
import pytest

from configs import tiny
from hamburger_jax.data.pipeline import PipelineConfig, make_iterator
from hamburger_jax.data.sources import DataError
from hamburger_jax.train import batches, checkpoints, integrity, sharding
from hamburger_jax.train.loop import _StepLog, train_and_evaluate
from hamburger_jax.train.metrics_writer import read_jsonl
from hamburger_jax.train.run_config import ConfigError, model_config, validate_config
from hamburger_jax.train.setup import Setup
from hamburger_jax.train.signals import Interrupted, StopOnSignal

from benchmarks import fault_injection

STEPS, EVERY = 6, 2


def _config(**overrides):
  c = tiny.get_config()
  c.update_from_flattened_dict({
      "num_train_steps": STEPS, "checkpoint.every_steps": EVERY, "checkpoint.keep": 3,
      "logging.every_steps": 1, "eval.every_steps": 0, "checkpoint.export": False,
      "logging.progress_bar": False, "logging.tensorboard": False, **overrides})
  return c


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
  """One finished tiny run: checkpoints of steps 2, 4, 6 (copied by the tests that damage it)."""
  workdir = tmp_path_factory.mktemp("base") / "w"
  train_and_evaluate(_config(), str(workdir))
  return workdir


def _copy(base_run, tmp_path):
  shutil.copytree(base_run, tmp_path / "w")
  return tmp_path / "w"


def _largest_state_file(workdir, step):
  files = [os.path.join(r, f) for r, _, fs in os.walk(workdir / "checkpoints" / str(step) / "state")
           for f in fs]
  return max(files, key=os.path.getsize)


def _flip(path, n=64):
  with open(path, "r+b") as f:
    data = bytearray(f.read())
    mid = len(data) // 2
    for i in range(mid, min(mid + n, len(data))):
      data[i] ^= 0xFF
    f.seek(0)
    f.write(bytes(data))


def _restore(workdir, config=None):
  """(step, state) of the newest good checkpoint, without compiling the train step."""
  config = config or _config()
  setup = Setup(config, model_config(config), sharding.make_mesh(config.mesh))
  ckpt = checkpoints.Checkpointer(str(workdir / "checkpoints"), EVERY, 3)
  try:
    step, state, _ = ckpt.restore_latest_good(setup.abstract_state())
  finally:
    ckpt.close()
  return step, state


@pytest.mark.slow
def test_corrupt_latest_checkpoint_is_skipped_and_training_resumes_from_the_good_one(
    base_run, tmp_path, caplog):
  workdir = _copy(base_run, tmp_path)
  _flip(_largest_state_file(workdir, 6))
  with caplog.at_level(logging.WARNING):
    state = train_and_evaluate(_config(num_train_steps=8), str(workdir))
  assert "Checkpoint step 6" in caplog.text and "skipped and moved" in caplog.text
  assert os.listdir(workdir / "checkpoints" / "rejected") == ["6"]
  assert int(state.step) == 8 and integrity.inspect(state).finite
  assert sorted(int(n) for n in os.listdir(workdir / "checkpoints") if n.isdigit()) == [4, 6, 8]
  steps = [r["step"] for r in read_jsonl(str(workdir)) if "train/loss" in r]
  assert steps == list(range(1, 9))            # rows 5, 6 of the first run replaced, no duplicates
  for step in (4, 6, 8):                       # every kept checkpoint reads back and is finite
    ckpt = checkpoints.Checkpointer(str(workdir / "checkpoints"), EVERY, 3)
    restored, _ = ckpt.restore(step, Setup(_config(), model_config(_config()),
                                           sharding.make_mesh(_config().mesh)).abstract_state())
    assert ckpt.verify(step, restored) is None
    ckpt.close()


def test_truncated_file_falls_back_to_the_intact_earlier_step(base_run, tmp_path, caplog):
  workdir = _copy(base_run, tmp_path)
  path = _largest_state_file(workdir, 6)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 3)
  with caplog.at_level(logging.WARNING):
    step, state = _restore(workdir)
  assert step == 4 and int(state.step) == 4 and integrity.inspect(state).finite
  assert "Checkpoint step 6" in caplog.text and "cannot be read" in caplog.text


def test_no_restorable_checkpoint_is_an_error_and_nothing_is_moved(base_run, tmp_path):
  workdir = _copy(base_run, tmp_path)
  for step in (2, 4, 6):
    _flip(_largest_state_file(workdir, step), n=4096)
  with pytest.raises(checkpoints.RestoreError, match=r"No checkpoint .* can be restored: step 6 "):
    _restore(workdir)
  assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "4", "6"]


def test_nonfinite_state_with_finite_loss_is_not_saved_and_the_good_step_is_kept(
    tmp_path, monkeypatch):
  """Step 3's loss is finite (computed before its update) but its update leaves NaN in the
  optimizer state: nothing is saved, keep=1 deletes nothing, the message names step 2."""
  original = Setup.__init__

  def poisoned(self, *args, **kwargs):
    original(self, *args, **kwargs)
    step_fn = self.train_step

    def train_step(state, batch):
      state, metrics = step_fn(state, batch)
      if int(state.step) == 3:
        state = state.replace(opt_state=jax.tree.map(lambda x: x * np.nan if x.ndim else x,
                                                     state.opt_state))
      return state, metrics
    self.train_step = train_step
  monkeypatch.setattr(Setup, "__init__", poisoned)
  with pytest.raises(FloatingPointError, match=r"state after step 3 holds NaN/inf .* The last "
                                               r"good checkpoint is step 2"):
    train_and_evaluate(_config(**{"checkpoint.every_steps": 1, "checkpoint.keep": 1}),
                       str(tmp_path))
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]


@pytest.mark.parametrize("overrides, message", [
    ({"model.num_layers": 3}, r"another model or mode .*config fields changed: \['model.num_layers'\]"),
    ({"mode": "base_lm"}, r"another model or mode .*\['mode'\]"),
])
def test_another_model_on_the_same_workdir_is_named(base_run, tmp_path, overrides, message):
  workdir = _copy(base_run, tmp_path)
  with pytest.raises(checkpoints.RestoreError, match=message):
    train_and_evaluate(_config(**overrides), str(workdir))
  assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "4", "6"]


def test_workdir_that_is_a_file_or_unwritable(tmp_path):
  afile = tmp_path / "afile"
  afile.write_text("x")
  with pytest.raises(ConfigError, match="is a file, not a directory"):
    train_and_evaluate(_config(), str(afile))
  ro = tmp_path / "ro"
  if os.geteuid() == 0:              # root ignores directory modes: use a read-only mount
    why = fault_injection.mount_tmpfs(str(ro), "1m,ro")
    if why:
      pytest.skip(f"root ignores directory modes and a read-only tmpfs cannot be mounted: {why}")
  else:
    ro.mkdir(mode=0o555)
  try:
    with pytest.raises(ConfigError, match=r"is not writable \((Read-only file system|Permission "
                                          r"denied)\): pass a directory you can write to"):
      train_and_evaluate(_config(), str(ro / "w"))
  finally:
    if os.geteuid() == 0:
      subprocess.run(["umount", str(ro)], check=False)


@pytest.mark.parametrize("field, value, message", [
    ("vocab_size", 256.0, r"model.vocab_size must be an integer, got 256.0 \(float\)"),
    ("vocab_size", "256", r"model.vocab_size must be an integer, got '256' \(str\)"),
    ("num_layers", True, r"model.num_layers must be an integer"),
])
def test_numeric_settings_must_be_integers(field, value, message):
  d = _config().to_dict()
  d["model"][field] = value
  with pytest.raises(ConfigError, match=message):
    validate_config(ml_collections.ConfigDict(d))


def test_seed_range():
  with pytest.raises(ConfigError, match=r"seed must be in 0..2\*\*32-1"):
    validate_config(_config(seed=2**40))


def _records(n, prompt_len):
  return [{"tokens": np.arange(3, 3 + prompt_len + 4, dtype=np.int32),
           "prompt_length": np.int32(prompt_len), "steps": np.array([2, 2], np.int32)}
          for _ in range(n)]


def test_packer_fails_fast_when_every_example_is_dropped():
  cfg = PipelineConfig("", "", seq_len=8, num_rows=2, max_steps=4, num_epochs=None, read_threads=1)
  it = make_iterator(cfg, source=_records(5, prompt_len=12), process_index=0, process_count=1)
  with pytest.raises(DataError, match=r"Every one of the 5 examples is dropped .* needs 13 macro "
                                      r"positions but seq_len is 8. Raise data.seq_len"):
    next(it)


def test_packer_counts_are_logged_and_warned(tmp_path, caplog):
  """9 of 24 dropped, 15 truncated: a warning naming data.seq_len and data/* metrics."""
  src = _records(9, prompt_len=40) + _records(15, prompt_len=32)   # 2 groups: 33 > 32 positions
  cfg = PipelineConfig("", "", seq_len=32, num_rows=4, max_steps=4, num_epochs=None,
                       shuffle=False, read_threads=1)
  it = make_iterator(cfg, source=src, process_index=0, process_count=1)
  for _ in range(6):                          # 4 truncated examples (one row each) per batch
    next(it)

  class Writer:
    rows = []

    def write(self, step, scalars):
      self.rows.append(scalars)
  log = _StepLog(Writer(), None, it.pack_stats, 32)
  with caplog.at_level(logging.WARNING):
    data = log._data()
  assert data["data/dropped"] >= 9 and data["data/truncated"] >= 15
  assert "raise data.seq_len" in caplog.text and "were dropped" in caplog.text


def test_batch_with_token_ids_outside_the_vocabulary():
  batch = {"group_tokens": np.full((1, 4, 4), 300), "target_tokens": np.zeros((1, 4, 4)),
           "group_lengths": np.ones((1, 4), int)}
  with pytest.raises(DataError, match="token id 300 but the model's vocabulary has 256 ids"):
    batches.check_batch(batch, "hamburger", 256)


def test_dataset_with_a_larger_vocabulary_is_refused_before_training(monkeypatch):
  class Info:
    metadata = {"vocab_size": 50_000}
  from hamburger_jax.data import builder
  monkeypatch.setattr(builder, "read_info", lambda *a, **k: Info())
  c = _config(**{"data.source": "tfds", "data.name": "big", "data.data_dir": "/d"})
  with pytest.raises(DataError, match=r"vocabulary of 50000 ids but the model has 256"):
    batches.check_dataset(c, model_config(c))


def test_first_signal_requests_a_stop_and_a_second_stops_at_once():
  before = signal.getsignal(signal.SIGINT)     # default_int_handler, or SIG_IGN in a test worker
  with StopOnSignal() as stop:
    os.kill(os.getpid(), signal.SIGINT)
    assert stop.requested and stop.signum == signal.SIGINT
    err = stop.interrupted(5, 10, "/w")
    assert isinstance(err, KeyboardInterrupt) and err.saved and "step 5 of 10" in str(err)
    with pytest.raises(Interrupted, match="Second SIGINT"):
      os.kill(os.getpid(), signal.SIGINT)
  assert signal.getsignal(signal.SIGINT) is before
