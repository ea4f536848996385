"""Shared test setup: CPU, float32 matmuls at full precision, one persistent XLA compilation
cache for the whole run (test processes and the subprocesses they start compile many identical
programs; the cache is made fresh per run and removed after it), and XLA's CPU code generated
without LLVM's expensive passes (`--xla_llvm_disable_expensive_passes`: less compile time, the
same numbers bit for bit; docs/results/tests.md)."""

import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_llvm_disable_expensive_passes" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_llvm_disable_expensive_passes=true").strip()
# Set by the first process of the run (pytest, or xdist's controller); its workers and every
# subprocess inherit the variables, so they share one cache.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="hamburger_jax_test_xla_")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_unconfigure():
  if _OWN_CACHE:
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


def pytest_collection_modifyitems(items):
  """Long tests first (stable otherwise): with `-n 2 --dist loadfile` their files start at once."""
  items.sort(key=lambda item: item.get_closest_marker("run_first") is None)
