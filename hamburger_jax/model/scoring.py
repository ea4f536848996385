"""Per-token values of whole sequences under the base model, jitted per length bucket.

    scorer = Scorer(cfg, params, metric="entropy")      # or "probability" (1 - p), "nll" (-log p)
    values = scorer.score([ids_a, ids_b])               # float32 [L_i]; value i from logits at i - 1
    logp, top_ids, top_logp = scorer.top_log_probs([ids_a], k=5)[0]   # [L], [L, k], [L, k]

Used by data segmentation (entropy of the base's next-token distribution), by evaluation (the
base model's NLL of generated answers) and by the server (log-probs of a prompt's tokens).
"""

from __future__ import annotations

import collections
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.model.config import LlamaConfig
from hamburger_jax.model.llama import LlamaModel

METRICS = ("entropy", "probability", "nll")


def default_buckets(max_length: int, min_bucket: int = 32) -> tuple[int, ...]:
  """32, 48, 64, 96, 128, 192, .. (powers of two and 1.5x between), up to >= max_length."""
  buckets, p = [], min_bucket
  while True:
    for b in (p, p * 3 // 2):
      buckets.append(b)
      if b >= max_length:
        return tuple(buckets)
    p *= 2


# Traces (= compiles) of `_token_values` so far, per (model config, metric).
TRACES: collections.Counter = collections.Counter()


@functools.partial(jax.jit, static_argnums=(0, 1))
def _token_values(cfg: LlamaConfig, metric: str, params, tokens, lengths):
  """tokens [B, L], lengths [B] -> values [B, L]: value of token i from the logits at i - 1."""
  TRACES[(cfg, metric)] += 1
  seq = tokens.shape[1]
  segment_ids = (jnp.arange(seq)[None, :] < lengths[:, None]).astype(jnp.int32)
  logits = LlamaModel(cfg).apply({"params": params}, tokens, segment_ids=segment_ids).logits
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)      # [B, L, V]
  if metric == "entropy":
    v = -jnp.sum(jnp.exp(logp) * logp, axis=-1)[:, :-1]               # [B, L - 1]
  else:
    picked = jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]
    v = -picked if metric == "nll" else 1.0 - jnp.exp(picked)
  return jnp.concatenate([jnp.zeros_like(v[:, :1]), v], axis=1)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _log_probs_and_top(cfg: LlamaConfig, k: int, params, tokens, lengths):
  """tokens [B, L], lengths [B] -> (log p of token i from the logits at i - 1 [B, L] (entry 0 is
  0), the k most likely next tokens after each position: ids [B, L, k] int32 and log p [B, L, k])."""
  TRACES[(cfg, f"top{k}")] += 1
  seq = tokens.shape[1]
  segment_ids = (jnp.arange(seq)[None, :] < lengths[:, None]).astype(jnp.int32)
  logits = LlamaModel(cfg).apply({"params": params}, tokens,
                                 segment_ids=segment_ids).logits.astype(jnp.float32)
  log_norm = jax.nn.logsumexp(logits, axis=-1)                          # [B, L]
  picked = jnp.take_along_axis(logits[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]
  picked = picked - log_norm[:, :-1]
  top_logits, top_ids = jax.lax.top_k(logits, k)                        # no [B, L, V] log-probs
  return (jnp.concatenate([jnp.zeros_like(picked[:, :1]), picked], axis=1),
          top_ids.astype(jnp.int32), top_logits - log_norm[..., None])


class Scorer:
  """Per-token values of whole sequences under the base model (jitted, bucketed, batched)."""

  def __init__(self, model_cfg: LlamaConfig, params, metric: str = "entropy",
               buckets: Sequence[int] = (), max_length: int = 2048, tokens_per_batch: int = 8192,
               max_rows: int = 256):
    if metric not in METRICS:
      raise ValueError(f"Unknown metric {metric!r}: use one of {METRICS}.")
    self.model_cfg = model_cfg
    self.params = params
    self.buckets = tuple(sorted(buckets)) or default_buckets(max_length)
    self.tokens_per_batch = tokens_per_batch
    self.max_rows = max_rows
    self.metric = metric

  @property
  def num_traces(self) -> int:
    """Compiles so far for this model and metric (shared by Scorers): one per bucket and row
    count (`rows(bucket)`, or the power of two >= a bucket's sequences when they are fewer)."""
    return TRACES[(self.model_cfg, self.metric)]

  def bucket(self, length: int) -> int:
    for b in self.buckets:
      if length <= b:
        return b
    raise ValueError(f"A sequence of {length} tokens exceeds the largest bucket "
                     f"{self.buckets[-1]}: raise max_length / pass larger buckets.")

  def rows(self, bucket: int) -> int:
    """Rows per batch for a bucket: the largest power of two within the token budget."""
    n = max(1, min(self.max_rows, self.tokens_per_batch // bucket))
    return 1 << (n.bit_length() - 1)

  def _batches(self, seqs: Sequence[np.ndarray]):
    by_bucket: dict[int, list[int]] = collections.defaultdict(list)
    for i, s in enumerate(seqs):
      by_bucket[self.bucket(len(s))].append(i)
    for b in sorted(by_bucket):
      idx = by_bucket[b]
      # A bucket holding few sequences gets fewer rows (a power of two: bounded compiles).
      rows = min(self.rows(b), 1 << (len(idx) - 1).bit_length())
      for start in range(0, len(idx), rows):
        members = idx[start:start + rows]
        tokens = np.zeros((rows, b), np.int32)
        lengths = np.zeros((rows,), np.int32)
        for r, i in enumerate(members):
          tokens[r, :len(seqs[i])] = seqs[i]
          lengths[r] = len(seqs[i])
        yield members, tokens, lengths

  def _run(self, seqs, fn, on_batch=None) -> list:
    """fn(tokens, lengths) -> a pytree of [B, L, ...] arrays, cut back to each sequence."""
    out: list = [None] * len(seqs)

    def collect(members, result):
      result = jax.device_get(result)
      for r, i in enumerate(members):
        out[i] = jax.tree_util.tree_map(lambda x, r=r, i=i: x[r, :len(seqs[i])], result)
      if on_batch is not None:
        on_batch(len(members))

    pending = None
    for members, tokens, lengths in self._batches(seqs):
      # Dispatched asynchronously: the device works while the host builds the next batch.
      result = fn(tokens, lengths)
      if pending is not None:
        collect(*pending)
      pending = (members, result)
    if pending is not None:
      collect(*pending)
    return out

  def score(self, seqs: Sequence[np.ndarray],
            on_batch: Callable[[int], None] | None = None) -> list[np.ndarray]:
    """Sequences (int [L_i]) -> values (float32 [L_i]; entry 0 is 0, it has no predictor)."""
    return self._run(seqs, functools.partial(_token_values, self.model_cfg, self.metric,
                                             self.params), on_batch)

  def top_log_probs(self, seqs: Sequence[np.ndarray], k: int) -> list[tuple]:
    """Sequences (int [L_i]) -> per sequence (log p of each token [L_i] (entry 0 is 0), the k
    most likely next tokens after each position: ids [L_i, k] and log p [L_i, k]); whatever the
    metric. Compiles once per bucket, row count and k."""
    if not 1 <= k <= self.model_cfg.vocab_size:
      raise ValueError(f"k must be in 1..{self.model_cfg.vocab_size}, got {k}.")
    return self._run(seqs, functools.partial(_log_probs_and_top, self.model_cfg, k, self.params))
