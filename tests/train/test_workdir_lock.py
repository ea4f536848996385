"""One run per workdir: a second run on a held workdir is refused before it writes anything
(train.py: exit 2, one line naming the holder); the lock of a killed run is taken over."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from configs import tiny
from hamburger_jax.train.loop import check_workdir, train_and_evaluate
from hamburger_jax.train.workdir_lock import LOCK_FILE, WorkdirBusy, WorkdirLock, check_free

from tests.fixture_paths import REPO

_HOLD = r"""
import sys, time
from hamburger_jax.train.workdir_lock import WorkdirLock
with WorkdirLock(sys.argv[1]):
  print("held", flush=True)
  time.sleep(600)
"""


def _holder_process(workdir):
  """A process holding the lock of `workdir` (returns once it holds it)."""
  proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(workdir)], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.PIPE,
                          text=True)
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_a_held_workdir_is_refused_naming_the_holder(tmp_path):
  workdir = tmp_path / "w"
  workdir.mkdir()
  with WorkdirLock(str(workdir)):
    record = json.loads((workdir / LOCK_FILE).read_text())
    assert record["pid"] == os.getpid() and record["host"]
    with pytest.raises(WorkdirBusy, match=rf"in use by another training run \(pid {os.getpid()} "
                                          r"on host .*, started \d{4}-\d\d-\d\d .*another "
                                          r"--workdir"):
      check_free(str(workdir))
    before = sorted(os.listdir(workdir))
    c = tiny.get_config()
    c.num_train_steps = 1
    with pytest.raises(WorkdirBusy):
      train_and_evaluate(c, str(workdir))
    assert sorted(os.listdir(workdir)) == before               # nothing written
  check_free(str(workdir))                                     # released
  assert (workdir / LOCK_FILE).read_text() == ""


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path, caplog):
  workdir = tmp_path / "w"
  workdir.mkdir()
  proc = _holder_process(workdir)
  try:
    with pytest.raises(WorkdirBusy, match=f"pid {proc.pid} "):
      check_workdir(str(workdir))
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
  assert json.loads((workdir / LOCK_FILE).read_text())["pid"] == proc.pid   # left behind
  with caplog.at_level("INFO"), WorkdirLock(str(workdir)):
    assert json.loads((workdir / LOCK_FILE).read_text())["pid"] == os.getpid()
  assert f"pid {proc.pid}" in caplog.text and "Taking over" in caplog.text


def test_train_py_on_a_held_workdir_exits_2_with_one_line(tmp_path):
  workdir = tmp_path / "w"
  workdir.mkdir()
  proc = _holder_process(workdir)
  try:
    start = time.time()
    out = subprocess.run(
        [sys.executable, "train.py", "--config", "configs/tiny.py", f"--workdir={workdir}"],
        cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
        timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert out.stderr.startswith(f"error: --workdir {workdir} is in use by another training run "
                                 f"(pid {proc.pid} on host ")
    assert os.listdir(workdir) == [LOCK_FILE]
    assert time.time() - start < 120
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
