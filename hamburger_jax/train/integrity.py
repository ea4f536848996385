"""Integrity of a train state: which leaves are finite, and a bit-level digest of every leaf.

    report = inspect(state)         # one jitted pass on device; host result
    report.finite                   # False if any float leaf holds NaN/inf
    report.bad_leaves               # their paths, e.g. ["params['base']['norm']['scale']"]
    report.digest                   # [[sum, weighted sum], ...] of each leaf's bits (uint32)

A checkpoint is saved only if its state is finite, with its digest beside it; on restore the
digest is recomputed, so a flipped or lost byte in the stored arrays is found even when the
values it gives are finite. The digest is exact integer arithmetic (mod 2**32), so it does not
depend on how the leaves are sharded.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

_MIX = 2654435761          # Knuth's multiplicative hash constant: weights each element's position


@dataclasses.dataclass(frozen=True)
class Report:
  paths: tuple[str, ...]
  finite_leaves: tuple[bool, ...]
  digest: tuple[tuple[int, int], ...]

  @property
  def finite(self) -> bool:
    return all(self.finite_leaves)

  @property
  def bad_leaves(self) -> list[str]:
    return [p for p, ok in zip(self.paths, self.finite_leaves) if not ok]

  def mismatch(self, saved_digest) -> str | None:
    """The first leaf whose digest differs from `saved_digest` (a list of pairs), else None."""
    saved = [tuple(int(v) for v in d) for d in saved_digest]
    if len(saved) != len(self.digest):
      return f"{len(saved)} leaves were saved but {len(self.digest)} were read"
    for path, a, b in zip(self.paths, saved, self.digest):
      if a != b:
        return path
    return None


def _bits(x: jax.Array) -> jax.Array:
  """A leaf's raw bits as a flat uint32 vector (1-, 2-, 4- and 8-byte dtypes)."""
  if x.dtype == jnp.bool_:
    return x.reshape(-1).astype(jnp.uint32)
  size = x.dtype.itemsize
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[size]
  return jax.lax.bitcast_convert_type(x, unsigned).reshape(-1).astype(jnp.uint32)


def _leaf_check(x):
  x = jnp.asarray(x)
  finite = jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.bool_(True)
  bits = _bits(x)
  weights = jnp.arange(bits.size, dtype=jnp.uint32) * jnp.uint32(_MIX) + jnp.uint32(1)
  return finite, jnp.stack([jnp.sum(bits, dtype=jnp.uint32),
                            jnp.sum(bits * weights, dtype=jnp.uint32)])


@jax.jit
def _check(leaves):
  out = [_leaf_check(x) for x in leaves]
  if not out:
    return jnp.zeros((0,), bool), jnp.zeros((0, 2), jnp.uint32)
  return jnp.stack([f for f, _ in out]), jnp.stack([d for _, d in out])


def inspect(state) -> Report:
  """Finite flags and digest of every array leaf of `state` (None leaves are skipped)."""
  with_paths = jax.tree_util.tree_leaves_with_path(state)
  paths = tuple(jax.tree_util.keystr(p) for p, _ in with_paths)
  finite, digest = jax.device_get(_check([x for _, x in with_paths]))
  return Report(paths, tuple(bool(f) for f in np.asarray(finite)),
                tuple((int(a), int(b)) for a, b in np.asarray(digest)))
