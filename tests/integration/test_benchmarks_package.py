"""benchmarks/ is a package of at most 8 benchmarks, each run as `python -m benchmarks.NAME`;
experiments/ likewise; nothing in the repository edits sys.path."""

import os
import subprocess
import sys

import pytest

from tests.fixture_paths import REPO

NOT_BENCHMARKS = ("__init__.py", "common.py")
SYS_PATH_EDITS = tuple("sys.path." + verb for verb in ("insert", "append"))   # not spelt out here


def _modules(package: str) -> list[str]:
  folder = os.path.join(REPO, package)
  return sorted(f[:-3] for f in os.listdir(folder)
                if f.endswith(".py") and f not in NOT_BENCHMARKS)


def test_at_most_eight_benchmarks():
  names = _modules("benchmarks")
  assert 1 <= len(names) <= 8, names


@pytest.mark.parametrize("module", [f"benchmarks.{n}" for n in _modules("benchmarks")]
                         + [f"experiments.{n}" for n in _modules("experiments")])
def test_runs_as_a_module(module):
  proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True,
                        text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                        check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "usage" in proc.stdout.lower() or "--" in proc.stdout


def test_no_file_edits_sys_path():
  found = []
  for root, dirs, files in os.walk(REPO):
    dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("node_modules", "runs")]
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(root, name)
        with open(path, encoding="utf-8", errors="replace") as f:
          text = f.read()
        if any(edit in text for edit in SYS_PATH_EDITS):
          found.append(os.path.relpath(path, REPO))
  assert not found, found
