"""Ahead-of-time compiled decode functions, once per (function, argument shapes), and the
power-of-two shape buckets that keep their number small.

    ex = Executables(engine, {"prefill": loop.prefill, "loop": loop.loop}, donate={"loop": (2,)})
    state = ex("prefill", params, ...)          # compiled on first use of these shapes
    rows = next_pow2(len(prompts))
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from hamburger_jax.decode.mesh import on_mesh
from hamburger_jax.model import cpu_dots


def signature(args) -> tuple:
  """Hashable shapes/dtypes (and tree structure) of the traced arguments: the compile key."""
  leaves, tree = jax.tree_util.tree_flatten(args)
  return (tree, tuple((np.shape(x), np.result_type(x).name) for x in leaves))


class Executables:
  """AOT-compiled functions of one engine, once per (function, argument shapes).

  functions: name -> fn(engine, *args); donate: name -> argnums donated (on accelerators the
  loop updates the KV buffers in place). `compile_s` adds up the seconds spent compiling. An
  engine with a mesh traces on it (`mesh.on_mesh`); an engine with cpu_dots "plain" compiles
  with plain dots on a CPU (`plain_cpu_dots`).
  """

  def __init__(self, engine, functions: dict, donate: dict | None = None):
    self.engine, self.functions, self.donate = engine, functions, donate or {}
    self._compiled: dict[tuple, Any] = {}
    self.compile_s = 0.0

  def __call__(self, name: str, *args):
    key = (name, signature(args))
    if key not in self._compiled:
      t0 = time.perf_counter()
      fn = jax.jit(on_mesh(self.functions[name]), static_argnums=0,
                   donate_argnums=self.donate.get(name, ()))
      mode = "plain" if plain_cpu_dots(self.engine) else "ynnpack"
      self._compiled[key] = cpu_dots.compile_for(fn, (self.engine, *args), mode)
      self.compile_s += time.perf_counter() - t0
    return self._compiled[key](*args)

  @property
  def compiled(self) -> dict:
    """(name, argument signature) -> the compiled executable, for inspection (HLO, costs)."""
    return dict(self._compiled)


def plain_cpu_dots(engine) -> bool:
  """Whether the engine's programs compile with plain dots (`model/cpu_dots.py`): asked
  for, and the programs run on CPUs."""
  if getattr(engine, "cpu_dots", cpu_dots.DEFAULT) != "plain":
    return False
  mesh = getattr(engine, "mesh", None)
  platform = mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()
  return platform == "cpu"


def next_pow2(n: int, floor: int = 1) -> int:
  """The smallest power of two >= max(n, floor)."""
  n = max(n, floor)
  return 1 << (n - 1).bit_length()
