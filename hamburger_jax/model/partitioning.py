"""Logical sharding constraints on activations, active only inside `activation_sharding(...)`.

    with activation_sharding(mesh, rules):          # entered while tracing the train step
      x = constrain(x, ("activation_batch", "activation_length", "activation_embed"))

Outside the context (decoding, CPU tests) `constrain` returns its input unchanged. Logical names
are mapped to mesh axes by the same rules as the parameters; a mesh axis that does not divide its
dimension is dropped (that dimension is replicated).
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

_STATE = threading.local()

BATCH = "activation_batch"
LENGTH = "activation_length"
EMBED = "activation_embed"
HEADS = "activation_heads"
KV_HEADS = "activation_kv_heads"
MLP = "activation_mlp"
VOCAB = "activation_vocab"


@contextlib.contextmanager
def activation_sharding(mesh, rules):
  """Makes `constrain` and `current_mesh` see `mesh` and the logical `rules` within the block."""
  previous = getattr(_STATE, "value", None)
  _STATE.value = (mesh, {name: axes for name, axes in rules})
  try:
    yield
  finally:
    _STATE.value = previous


def current_mesh():
  """The mesh of the enclosing `activation_sharding`, or None."""
  value = getattr(_STATE, "value", None)
  return None if value is None else value[0]


def platform() -> str:
  """'tpu' / 'gpu' / 'cpu': the context mesh's devices (AOT compiles), else the default backend."""
  mesh = current_mesh()
  if mesh is not None:
    return mesh.devices.flat[0].platform
  return jax.default_backend()


def mesh_axes(logical: Sequence[str | None], shape: Sequence[int]) -> P | None:
  """Logical names -> a PartitionSpec fitted to `shape` (None outside the context)."""
  value = getattr(_STATE, "value", None)
  if value is None:
    return None
  mesh, rules = value
  out, used = [], set()
  for dim, name in zip(shape, logical):
    axes = rules.get(name) if name else None
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    names = tuple(n for n in names if n not in used)
    size = math.prod(mesh.shape[n] for n in names)
    if not names or dim % size:
      out.append(None)
      continue
    used.update(names)
    out.append(names if len(names) > 1 else names[0])
  return P(*out)


def constrain(x, logical: Sequence[str | None]):
  """`with_sharding_constraint` by logical axis names; identity outside `activation_sharding`."""
  spec = mesh_axes(logical, x.shape)
  if spec is None:
    return x
  return jax.lax.with_sharding_constraint(x, NamedSharding(current_mesh(), spec))
