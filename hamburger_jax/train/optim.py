"""The optimizer: AdamW with separate learning rates for the base model and the grafted modules.

    tx = make_optimizer(config.optim, total_steps)      # over the *trainable* params only
    trainable, frozen = split_params(params, trainable_keys(mode, freeze_base))

Spec §6 defaults: lr 5e-5 (base) and 1e-4 (grafted: embedder, micro_decoder), linear warmup then
cosine to 1e-5, global-norm clipping at 1.0. Norm scales, biases and embedding tables get no
weight decay. Frozen parameters are kept out of the optimizer entirely (no state, no update), so
they stay bit-identical.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import optax

GRAFTED_KEYS = ("embedder", "micro_decoder", "merge_adapter")
# Parameter names (last path entry) that are never weight-decayed.
NO_DECAY_NAMES = ("scale", "bias", "embedding", "pos")


def trainable_keys(mode: str, freeze_base: bool) -> tuple[str, ...]:
  """Top-level param keys the optimizer updates."""
  if mode == "base_lm":
    if freeze_base:
      raise ValueError("freeze_base=True with mode='base_lm' would train nothing.")
    return ("base",)
  return GRAFTED_KEYS if freeze_base else ("base",) + GRAFTED_KEYS


def split_params(params: Mapping[str, Any], keys) -> tuple[dict, dict]:
  """-> (trainable {k in keys}, frozen {the rest}) by top-level key."""
  return ({k: v for k, v in params.items() if k in keys},
          {k: v for k, v in params.items() if k not in keys})


def param_labels(params) -> Any:
  """'base' for the base model's params, 'grafted' for everything else (same tree)."""
  return {k: jax.tree.map(lambda _, k=k: "base" if k == "base" else "grafted", v)
          for k, v in params.items()}


def decay_mask(params) -> Any:
  """True where weight decay applies: not on norm scales, biases, embeddings, position tables."""
  def keep(path, _):
    last = path[-1]
    return getattr(last, "key", None) not in NO_DECAY_NAMES
  return jax.tree_util.tree_map_with_path(keep, params)


def lr_schedule(peak: float, end: float, warmup_steps: int, total_steps: int) -> optax.Schedule:
  """0 -> peak linearly over warmup_steps, then cosine to min(end, peak) at total_steps."""
  warmup_steps = max(0, min(warmup_steps, total_steps - 1))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if warmup_steps else peak, peak_value=peak, warmup_steps=warmup_steps,
      decay_steps=max(total_steps, warmup_steps + 1), end_value=min(end, peak))


def schedules(optim_cfg, total_steps: int) -> dict[str, optax.Schedule]:
  """{'base': schedule, 'grafted': schedule} from the config's two peak learning rates."""
  return {name: lr_schedule(lr, optim_cfg.end_lr, optim_cfg.warmup_steps, total_steps)
          for name, lr in (("base", optim_cfg.base_lr), ("grafted", optim_cfg.grafted_lr))}


def _adamw(optim_cfg, schedule) -> optax.GradientTransformation:
  return optax.adamw(schedule, b1=optim_cfg.b1, b2=optim_cfg.b2, eps=optim_cfg.eps,
                     weight_decay=optim_cfg.weight_decay, mask=decay_mask)


def make_optimizer(optim_cfg, total_steps: int) -> optax.GradientTransformation:
  """clip_by_global_norm -> AdamW per label ('base' / 'grafted'), each with its own schedule.

  Gradient accumulation is done by the train step (a scan over micro-batches), so one update of
  this transformation is one optimizer step.
  """
  if optim_cfg.name != "adamw":
    raise ValueError(f"optim.name {optim_cfg.name!r} is not supported (only 'adamw').")
  sched = schedules(optim_cfg, total_steps)
  parts = {name: _adamw(optim_cfg, s) for name, s in sched.items()}
  chain = [optax.multi_transform(parts, param_labels)]
  if optim_cfg.grad_clip_norm > 0:
    chain.insert(0, optax.clip_by_global_norm(optim_cfg.grad_clip_norm))
  return optax.chain(*chain)
