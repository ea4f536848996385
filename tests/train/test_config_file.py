"""load_config_file reads configs/*.py from anywhere without putting the repository on sys.path."""

import os
import subprocess
import sys

from tests.fixture_paths import REPO

_SCRIPT = """
import sys
from hamburger_jax.train.run_config import load_config_file
config = load_config_file(sys.argv[1])
print(config.model.preset, sys.argv[2] in sys.path, sys.modules["configs"].__file__)
"""


def test_configs_package_resolves_without_sys_path(tmp_path):
  # Only hamburger_jax is importable (a link to it): `configs` is not, until the file loads.
  os.symlink(os.path.join(REPO, "hamburger_jax"), tmp_path / "hamburger_jax")
  env = dict(os.environ, PYTHONPATH=str(tmp_path), JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", _SCRIPT, os.path.join(REPO, "configs", "tiny.py"),
                         REPO], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  preset, on_path, init = proc.stdout.split()
  assert preset == "tiny" and on_path == "False"
  assert init == os.path.join(REPO, "configs", "__init__.py")
