"""Flax applies compiled as one program, for tests of small models.

Run eagerly, `module.apply` compiles each of its operations as its own XLA program (hundreds per
call shape, most of what a test of a tiny model spends). `apply` compiles the whole call once
per (module, method, static keywords, argument shapes):

    out = compiled.apply(model, {"params": params}, tokens, lengths, method=Model.embed_groups)

Keywords that are Python scalars or None (`decoding=True`, `max_targets=3`) are static; array
keywords (`cache=..`) are traced like the positional arguments.
"""

from __future__ import annotations

import functools

import jax

_STATIC = (bool, int, float, str, type(None))


@functools.lru_cache(maxsize=None)
def _jitted(module, method, static: tuple):
  def run(variables, args, traced):
    return module.apply(variables, *args, method=method, **traced, **dict(static))
  return jax.jit(run)


def apply(module, variables, *args, method=None, **kwargs):
  """module.apply(variables, *args, method=method, **kwargs), compiled as one program."""
  static = tuple(sorted((k, v) for k, v in kwargs.items() if isinstance(v, _STATIC)))
  traced = {k: v for k, v in kwargs.items() if not isinstance(v, _STATIC)}
  return _jitted(module, method, static)(variables, args, traced)
