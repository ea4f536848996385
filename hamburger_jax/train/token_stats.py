"""Per-token CE, accuracy and KL, and `chunked_map`: a function over chunks of positions.

    out = chunked_map(fn, (hidden [B, M, ...], targets [B, M, ...]), chunk=64)

`chunked_map` cuts axis 1 (positions) of its inputs into chunks of `chunk`, scans `fn` over them
under `jax.checkpoint` (each chunk's intermediates, e.g. float32 logits [B, chunk, S, V], are
recomputed in the backward pass instead of stored) and joins the outputs back along axis 1.
chunk = 0 calls `fn` on everything at once. Both give the same numbers.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from hamburger_jax.model import partitioning as pt


def kl_to_teacher(student_logits, teacher_logits):
  """KL(teacher || student) per position, [...]."""
  t_logp = jax.nn.log_softmax(teacher_logits.astype(jnp.float32), -1)
  s_logp = jax.nn.log_softmax(student_logits.astype(jnp.float32), -1)
  return jnp.sum(jnp.exp(t_logp) * (t_logp - s_logp), -1)


def vocab_constrained(logits):
  """Shards logits [B, ..., V] by batch and vocabulary (inside activation_sharding)."""
  return pt.constrain(logits, (pt.BATCH,) + (None,) * (logits.ndim - 2) + (pt.VOCAB,))


def stats_from_logits(logits, targets, teacher_logits=None):
  """logits [..., V] -> {"ce", "correct"(, "kl")} [...] float32."""
  logits = logits.astype(jnp.float32)
  out = {"ce": optax.softmax_cross_entropy_with_integer_labels(logits, targets),
         "correct": (jnp.argmax(logits, -1) == targets).astype(jnp.float32)}
  if teacher_logits is not None:
    out["kl"] = kl_to_teacher(logits, teacher_logits)
  return out


def chunked_map(fn: Callable, args: tuple, chunk: int = 0):
  """fn(*args) computed over chunks of axis 1 (None args pass through) -> fn's output tree."""
  m = next(a for a in args if a is not None).shape[1]
  if not chunk or chunk >= m:
    return fn(*args)
  n = -(-m // chunk)
  pad = n * chunk - m

  def split(x):
    if x is None:
      return None
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    return x.reshape((x.shape[0], n, chunk) + x.shape[2:]).swapaxes(0, 1)

  body = jax.checkpoint(lambda _, xs: (None, fn(*xs)), prevent_cse=False)
  _, out = jax.lax.scan(body, None, tuple(split(a) for a in args))
  merge = lambda x: x.swapaxes(0, 1).reshape((x.shape[1], n * chunk) + x.shape[3:])[:, :m]
  return jax.tree.map(merge, out)
