"""train.py answers unusable settings, workdirs and a full disk with one `error: ...` line on
stderr and exit code 2 (no traceback)."""

import os
import subprocess
import sys

import pytest

from benchmarks import fault_injection

from tests.fixture_paths import REPO


def _train(workdir, *args, timeout=600):
  cmd = [sys.executable, "train.py", "--config", "configs/tiny.py", f"--workdir={workdir}", *args]
  return subprocess.run(cmd, cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                        capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["--config.foo=1"], "error: --config.foo: the config has no field 'foo'"),
    (["--config.model.foo=1"], "error: --config.model.foo: the config has no field 'foo'"),
    (["--config.model.vocab_size=256.0"], "error: flag --config.model.vocab_size=256.0: invalid"),
    (["--config.seed=99999999999"], "error: seed must be in 0..2**32-1"),
    (["--config.mesh.data=2"], "error: mesh"),
    (["--config.data.source=tfds"], "error: data.source='tfds' needs data.name and data.data_dir"),
    (["extra"], "error: Unexpected arguments: ['extra']"),
])
@pytest.mark.slow
def test_bad_settings_are_one_line(tmp_path, args, message):
  out = _train(tmp_path / "w", *args)
  assert out.returncode == 2, out.stderr[-2000:]
  assert out.stderr.strip().splitlines() == [out.stderr.strip()]       # exactly one line
  assert out.stderr.startswith(message), out.stderr
  assert not os.path.exists(tmp_path / "w" / "checkpoints")


_CONFIG_FILES = {
    "syntax.py": ("def get_config(:\n", "line 1: invalid syntax: fix the config file."),
    "raises.py": ("def get_config():\n  raise ValueError('boom')\n",
                  "get_config() failed with ValueError: boom"),
    "nothing.py": ("x = 1\n", "the file defines no get_config()"),
}


@pytest.mark.parametrize("name", [*_CONFIG_FILES, "missing.py"])
@pytest.mark.slow
def test_bad_config_files_are_one_line(tmp_path, name):
  path = tmp_path / name
  if name in _CONFIG_FILES:
    path.write_text(_CONFIG_FILES[name][0])
  cmd = [sys.executable, "train.py", f"--config={path}", f"--workdir={tmp_path / 'w'}"]
  out = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 2, out.stderr[-2000:]
  assert out.stderr.strip().splitlines() == [out.stderr.strip()], out.stderr   # exactly one line
  expected = (_CONFIG_FILES[name][1] if name in _CONFIG_FILES
              else "cannot be read ([Errno 2] No such file or directory")
  assert out.stderr.startswith(f"error: --config {path}: ") and expected in out.stderr, out.stderr
  assert not os.path.exists(tmp_path / "w")

def test_workdir_that_is_a_file(tmp_path):
  (tmp_path / "f").write_text("x")
  out = _train(tmp_path / "f")
  assert out.returncode == 2 and out.stderr.strip() == (
      f"error: --workdir {tmp_path / 'f'} is a file, not a directory: pass a directory path.")


@pytest.mark.slow
def test_full_disk_is_one_line_and_the_run_resumes(tmp_path):
  mnt = tmp_path / "small"
  why = fault_injection.mount_tmpfs(str(mnt), "5m")
  if why:
    pytest.skip(f"cannot mount a tmpfs here: {why}")
  try:
    args = ["--config.num_train_steps=20", "--config.checkpoint.every_steps=2",
            "--config.eval.every_steps=0", "--config.logging.progress_bar=False",
            "--config.logging.tensorboard=False", "--config.checkpoint.export=False"]
    out = _train(mnt / "w", *args)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot write to {mnt / 'w'}: No space left on device. Free "
                           "space"), last
    saved = sorted(int(n) for n in os.listdir(mnt / "w" / "checkpoints") if n.isdigit())
    assert saved and f"last complete checkpoint (step {saved[-1]})" in last
  finally:
    subprocess.run(["umount", str(mnt)], check=False)
