"""Kill and resume: SIGKILL mid-run, SIGKILL during a save, SIGTERM / SIGINT (save, then exit
128 + signum with one line); the resumed losses are exact and metrics.jsonl has no duplicates."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.run_first      # minutes of subprocess training: start early
from tests.fixture_paths import REPO
STEPS, EVERY = 40, 5
ARGS = ["--config", os.path.join(REPO, "configs", "tiny.py"),
        f"--config.num_train_steps={STEPS}", f"--config.checkpoint.every_steps={EVERY}",
        "--config.logging.every_steps=1", "--config.eval.every_steps=0",
        "--config.checkpoint.export=False", "--config.logging.progress_bar=False",
        "--config.logging.tensorboard=False", "--config.optim.grad_accum_steps=2"]

# Runs train.py but SIGKILLs itself inside the data item's save of step KILL_STEP (mid-save).
_KILL_IN_SAVE = r"""
import os, runpy, signal, sys
import grain
KILL_STEP = int(os.environ["KILL_STEP"])
original = grain.checkpoint.CheckpointHandler.save
def save(self, directory, *args, **kwargs):
  if f"{os.sep}{KILL_STEP}." in str(directory):
    os.kill(os.getpid(), signal.SIGKILL)
  return original(self, directory, *args, **kwargs)
grain.checkpoint.CheckpointHandler.save = save
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  cache = tmp_path_factory.getbasetemp() / "jax_cache"
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO,
              JAX_COMPILATION_CACHE_DIR=str(cache),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


def _cmd(workdir, prefix=()):
  return [sys.executable, *prefix, os.path.join(REPO, "train.py"), f"--workdir={workdir}", *ARGS]


def _rows(workdir):
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f.read().splitlines() if line.endswith("}")]


def _finalized(workdir):
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


def _run(workdir, env, prefix=()):
  out = subprocess.run(_cmd(workdir, prefix), cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]


def _start_and_signal(workdir, env, sig, after_step=12):
  """Starts a run, sends `sig` once it has logged `after_step` and saved a checkpoint."""
  proc = subprocess.Popen(_cmd(workdir), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    rows = _rows(workdir)
    if rows and rows[-1]["step"] >= after_step and _finalized(workdir):
      proc.send_signal(sig)
      break
    time.sleep(0.005)
  return proc.wait(timeout=300)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, env):
  workdir = tmp_path_factory.mktemp("uninterrupted")
  _run(workdir, env)
  losses = {r["step"]: r["train/loss"] for r in _rows(workdir)}
  assert sorted(losses) == list(range(1, STEPS + 1))
  return losses


def _check_resumed(rows_before, workdir, resumed_from, reference):
  rows = _rows(workdir)
  assert [r["step"] for r in rows] == list(range(1, STEPS + 1))    # rows of lost steps replaced
  for r in rows:
    assert r["train/loss"] == reference[r["step"]], r["step"]
  assert rows[:resumed_from] == rows_before[:resumed_from]          # earlier rows kept as they were


@pytest.mark.slow
def test_sigkill_mid_run_resumes_exactly(tmp_path, env, reference):
  rc = _start_and_signal(tmp_path, env, signal.SIGKILL)
  assert rc == -signal.SIGKILL
  rows = _rows(tmp_path)
  assert rows[-1]["step"] < STEPS                     # it really died mid-run
  for r in rows:                                      # and had matched the reference so far
    assert r["train/loss"] == reference[r["step"]]
  saved = _finalized(tmp_path)[-1]
  assert saved % EVERY == 0 and saved >= EVERY
  _run(tmp_path, env)
  _check_resumed(rows, tmp_path, saved, reference)


@pytest.mark.slow
def test_sigkill_during_save_keeps_previous_checkpoint(tmp_path, env, reference):
  kill_step = 3 * EVERY
  proc = subprocess.run(_cmd(tmp_path, ("-c", _KILL_IN_SAVE)), cwd=REPO,
                        env=dict(env, KILL_STEP=str(kill_step)), capture_output=True, timeout=600)
  assert proc.returncode == -signal.SIGKILL
  ckpt_dir = tmp_path / "checkpoints"
  assert _finalized(tmp_path)[-1] == kill_step - EVERY
  assert any(n.startswith(f"{kill_step}.") for n in os.listdir(ckpt_dir))   # the cut-short save
  rows = _rows(tmp_path)
  _run(tmp_path, env)
  _check_resumed(rows, tmp_path, kill_step - EVERY, reference)
  assert not any("tmp" in n for n in os.listdir(ckpt_dir))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow
def test_signal_saves_and_exits_with_its_code(tmp_path, env, reference, sig):
  proc = subprocess.Popen(_cmd(tmp_path), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    rows = _rows(tmp_path)
    if rows and rows[-1]["step"] >= 12 and _finalized(tmp_path):
      proc.send_signal(sig)
      break
    time.sleep(0.005)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 128 + sig
  last_line = err.strip().splitlines()[-1]
  assert last_line.startswith(f"stopped: Stopped early by {signal.Signals(sig).name} at step ")
  rows = _rows(tmp_path)
  last = rows[-1]["step"]
  assert last < STEPS and _finalized(tmp_path)[-1] == last   # saved where it stopped
  assert f"at step {last} of {STEPS}" in last_line
  _run(tmp_path, env)
  _check_resumed(rows, tmp_path, last, reference)
