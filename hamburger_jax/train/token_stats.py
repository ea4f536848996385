"""Per-token CE, accuracy and KL from hidden states, the LM head applied in chunks of positions.

    stats = token_stats(logits_fn, hidden [B, M, *R, D], targets [B, M, *R], chunk=64)
    stats["ce"], stats["correct"] (and stats["kl"] with a teacher): each [B, M, *R] float32

With `chunk` = c > 0 the M positions are cut into chunks of c, scanned, and each chunk's float32
logits [B, c, *R, V] are recomputed in the backward pass instead of stored: the full
[B, M, *R, V] tensor never exists. chunk = 0 applies the head to everything at once. Both give
the same numbers.
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


def stats_from_logits(logits, targets, teacher_logits=None):
  """logits [..., V] -> {"ce", "correct"(, "kl")} [...] float32."""
  logits = logits.astype(jnp.float32)
  out = {"ce": optax.softmax_cross_entropy_with_integer_labels(logits, targets),
         "correct": (jnp.argmax(logits, -1) == targets).astype(jnp.float32)}
  if teacher_logits is not None:
    out["kl"] = kl_to_teacher(logits, teacher_logits)
  return out


def _vocab_constrained(logits):
  axes = (pt.BATCH,) + (None,) * (logits.ndim - 2) + (pt.VOCAB,)
  return pt.constrain(logits, axes)


def token_stats(logits_fn: Callable, hidden, targets, chunk: int = 0,
                teacher_fn: Callable | None = None, teacher_hidden=None):
  """Per-token statistics of `logits_fn(hidden)` against `targets` (see the module docstring).

  teacher_fn / teacher_hidden (same shape as hidden): adds "kl", KL(teacher || student).
  """
  def stats(h, tgt, th):
    logits = _vocab_constrained(logits_fn(h))
    teacher = None if th is None else _vocab_constrained(teacher_fn(th))
    return stats_from_logits(logits, tgt, teacher)

  m = hidden.shape[1]
  if not chunk or chunk >= m:
    return stats(hidden, targets, teacher_hidden)
  n = -(-m // chunk)
  pad = n * chunk - m

  def split(x):
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    return x.reshape((x.shape[0], n, chunk) + x.shape[2:]).swapaxes(0, 1)

  body = jax.checkpoint(lambda _, xs: (None, stats(*xs)), prevent_cse=False)
  xs = (split(hidden), split(targets), None if teacher_hidden is None else split(teacher_hidden))
  _, out = jax.lax.scan(body, None, xs)
  merge = lambda x: x.swapaxes(0, 1).reshape((x.shape[1], n * chunk) + x.shape[3:])[:, :m]
  return jax.tree.map(merge, out)
