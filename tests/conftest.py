"""Shared test setup: CPU, float32 matmuls at full precision, the repo on sys.path."""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_collection_modifyitems(items):
  """Long tests first (stable otherwise): with `-n 2 --dist loadfile` their files start at once."""
  items.sort(key=lambda item: item.get_closest_marker("run_first") is None)
