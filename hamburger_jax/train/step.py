"""The train state and the jitted steps: one optimizer step (gradient accumulation by scan), one
evaluation batch, and the token-weighted mean of metrics (the one place metrics are averaged).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from hamburger_jax.train import optim

@struct.dataclass
class TrainState:
  step: jax.Array        # int32 []: optimizer steps taken
  params: Any            # {"base", "embedder", "micro_decoder"} ({"base"} in mode base_lm)
  opt_state: Any         # optax state of the trainable sub-tree only
  teacher: Any = None    # base params at start (distillation with a trained base), else None


def combine_metrics(stacked):
  """Per-micro-batch metrics [K] -> token-weighted means (token counts summed)."""
  w = stacked["tokens"] / jnp.maximum(jnp.sum(stacked["tokens"]), 1.0)
  out = {k: jnp.sum(v * w) for k, v in stacked.items()}
  out["tokens"] = jnp.sum(stacked["tokens"])
  out["perplexity"] = jnp.exp(out["label_loss"])
  return out


def train_step(state: TrainState, batch, *, loss_fn, tx, trainable, accum_steps, micro_sharding,
               lr_fns):
  """One optimizer step over `accum_steps` micro-batches (scan) -> (new state, metrics).

  batch: the batch.py fields, [B, ...] sharded over data x fsdp. Gradients are token-weighted
  over the whole batch; frozen params (outside `trainable`) are passed through untouched.
  """
  train_p, frozen_p = optim.split_params(state.params, trainable)

  def grads_of(mb):
    def weighted(tp):
      loss, metrics = loss_fn({**frozen_p, **tp}, mb, state.teacher)
      return loss * jax.lax.stop_gradient(metrics["tokens"]), metrics
    (_, metrics), grads = jax.value_and_grad(weighted, has_aux=True)(train_p)
    return grads, metrics

  def micro(carry, mb):
    grads, metrics = grads_of(jax.lax.with_sharding_constraint(mb, micro_sharding))
    return jax.tree.map(jnp.add, carry, grads), metrics

  split = lambda x: x.reshape((x.shape[0] // accum_steps, accum_steps) + x.shape[1:]).swapaxes(0, 1)
  zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), train_p)
  grads, stacked = jax.lax.scan(micro, zeros, jax.tree.map(split, batch))
  metrics = combine_metrics(stacked)
  grads = jax.tree.map(lambda g, p: (g / jnp.maximum(metrics["tokens"], 1.0)).astype(p.dtype),
                       grads, train_p)
  updates, opt_state = tx.update(grads, state.opt_state, train_p)
  params = {**state.params, **optax.apply_updates(train_p, updates)}
  metrics["grad_norm"] = optax.global_norm(grads)
  metrics.update({f"lr_{k}": fn(state.step) for k, fn in lr_fns.items()})
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params, batch, teacher, *, loss_fn):
  """-> metrics of one held-out batch (no gradients)."""
  return loss_fn(params, batch, teacher)[1]
