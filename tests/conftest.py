"""Shared test setup: CPU, float32 matmuls at full precision, one persistent XLA compilation
cache for the whole run (test processes and the subprocesses they start compile many identical
programs; the cache is made fresh per run and removed after it), and XLA's CPU code generated
for compile and run time (`tests/xla_flags.py`: without LLVM's expensive passes, the same numbers
bit for bit, and at backend optimisation level 0, float results moved in the last bits; the
README's commands run as users run them; docs/results/tests.md)."""

import gc
import os
import shutil
import tempfile

from tests import xla_flags

os.environ.setdefault("JAX_PLATFORMS", "cpu")
xla_flags.add_test_flags()
# Set by the first process of the run (pytest, or xdist's controller); its workers and every
# subprocess inherit the variables, so they share one cache.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="hamburger_jax_test_xla_")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_unconfigure():
  if _OWN_CACHE:
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


def pytest_collection_modifyitems(config, items):
  """Leaves out the tests marked `heavy` unless `-m` names the mark or a test is named by its id
  (`pytest -m heavy tests`, `pytest tests/x.py::test_y`); long tests first (stable otherwise):
  with `-n 2 --dist loadfile` their files start at once."""
  if "heavy" not in config.option.markexpr and not any("::" in arg for arg in config.args):
    heavy = [item for item in items if item.get_closest_marker("heavy")]
    if heavy:
      config.hook.pytest_deselected(items=heavy)
      items[:] = [item for item in items if not item.get_closest_marker("heavy")]
  items.sort(key=lambda item: item.get_closest_marker("run_first") is None)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """After each test file: drop JAX's in-memory caches of traced and compiled programs (a later
  file that needs one again reads it back from the persistent cache), so a process running
  hundreds of tests does not keep every program it ever compiled in memory."""
  yield
  jax.clear_caches()
  gc.collect()
