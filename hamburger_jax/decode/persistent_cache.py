"""XLA's persistent compilation cache for the decoding commands (decode.py, serve.py).

A command compiles its decode programs on first use (a minute for the shipped model on a 2-core
CPU); with the cache on, a later run with the same model, shapes and JAX version reads them back
from disk instead. JAX keys each entry by the program, the compile options and the backend, and
XLA's CPU loader refuses an entry compiled for other CPU features (it then compiles anew).

    directory = persistent_cache.enable(a.compilation_cache)   # None: the default place
"""

from __future__ import annotations

import os
from typing import Callable

import jax

ENV = "JAX_COMPILATION_CACHE_DIR"


def default_directory() -> str:
  """$JAX_COMPILATION_CACHE_DIR if set, else $XDG_CACHE_HOME (or ~/.cache)/hamburger_jax/xla."""
  if os.environ.get(ENV):
    return os.environ[ENV]
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "hamburger_jax", "xla")


def enable(directory: str | None = None,
           warn: Callable[[str], None] | None = None) -> str | None:
  """Turns the cache on at `directory` (None: `default_directory()`; "": off) for this process;
  returns the directory in use, or None when off. A directory that cannot be made leaves the
  cache off (the command still runs, compiling as without it) and says so through `warn`."""
  directory = default_directory() if directory is None else directory
  if not directory:
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  directory = os.path.expanduser(directory)
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError as e:
    jax.config.update("jax_enable_compilation_cache", False)
    if warn is not None:
      warn(f"the compilation cache {directory} cannot be made ({e.strerror}): compiling "
           "without it; pass --compilation_cache with a writable directory, or '' for none.")
    return None
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", directory)
  return directory
