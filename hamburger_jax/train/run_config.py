"""configs/*.py (ml_collections) -> the model's HamburgerConfig, and validation of a run config.

    cfg = model_config(config)       # frozen HamburgerConfig from model.preset + overrides
    validate_config(config)          # ValueError naming the field, before anything compiles
"""

from __future__ import annotations

import dataclasses

import jax

from hamburger_jax.model.config import PRESETS, HamburgerConfig
from hamburger_jax.model.execution import Execution
from hamburger_jax.train import batches, optim, sharding

MODES = ("hamburger", "base_lm")
_BASE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim")
_HAM_FIELDS = ("max_steps", "num_micro_layers", "merger_heads")


def model_config(config) -> HamburgerConfig:
  """The frozen HamburgerConfig: `model.preset` plus the non-zero overrides of `config.model`."""
  m = config.model
  if m.preset not in PRESETS:
    raise ValueError(f"model.preset {m.preset!r} is unknown; known presets: {sorted(PRESETS)}.")
  preset = PRESETS[m.preset]
  base = dataclasses.replace(preset.base, param_dtype=m.param_dtype, dtype=m.dtype,
                             **{k: m[k] for k in _BASE_FIELDS if m[k]})
  extra = {k: m[k] for k in _HAM_FIELDS if m[k]}
  layers = tuple(m.feature_layers) if m.feature_layers else preset.feature_layers
  if config.mode == "base_lm":
    layers = ()                      # the base model alone taps no features
  return dataclasses.replace(preset, base=base, feature_layers=layers, **extra)


def execution_config(config) -> Execution:
  """How the model computes (attention kernel, remat policy, scan) from `config.model`."""
  m = config.model
  return Execution(attention=m.attention, remat=m.remat, scan_layers=bool(m.scan_layers),
                   attention_block=m.attention_block)


def validate_config(config, num_devices: int | None = None) -> None:
  """Raises ValueError naming the field for settings that cannot work (before any compile)."""
  if config.mode not in MODES:
    raise ValueError(f"mode {config.mode!r} is unknown: use one of {MODES}.")
  counts = {"num_train_steps": config.num_train_steps, "logging.every_steps":
            config.logging.every_steps, "checkpoint.every_steps": config.checkpoint.every_steps,
            "optim.grad_accum_steps": config.optim.grad_accum_steps}
  if any(v < 1 for v in counts.values()):
    raise ValueError(f"These settings must be >= 1: {counts}.")
  optim.trainable_keys(config.mode, config.freeze_base)
  model_config(config)
  execution_config(config)
  if config.loss.chunk_size < 0:
    raise ValueError(f"loss.chunk_size must be >= 0 (0 = no chunking), got {config.loss.chunk_size}.")
  shards = sharding.mesh_shape(config.mesh, num_devices or jax.device_count())
  rows_per_shard = shards[0] * shards[1] * config.optim.grad_accum_steps
  if config.data.batch_size % rows_per_shard:
    raise ValueError(
        f"data.batch_size={config.data.batch_size} is not divisible by mesh data*fsdp "
        f"({shards[0]}*{shards[1]}) x optim.grad_accum_steps ({config.optim.grad_accum_steps}) "
        f"= {rows_per_shard}.")
  if config.data.batch_size % jax.process_count():
    raise ValueError(f"data.batch_size={config.data.batch_size} is not divisible by the "
                     f"{jax.process_count()} processes.")
  if eval_rows(config) % (shards[0] * shards[1]):
    raise ValueError(f"eval batch of {eval_rows(config)} rows is not divisible by mesh data*fsdp.")
  if config.optim.name != "adamw":
    raise ValueError(f"optim.name {config.optim.name!r} is not supported (only 'adamw').")
  if config.mode == "base_lm" and config.loss.kl_weight:
    raise ValueError("loss.kl_weight applies to mode 'hamburger' only.")
  if config.model.max_targets and config.loss.kl_weight:
    raise ValueError("model.max_targets and loss.kl_weight cannot be combined (the teacher logits "
                     "are per macro position): set model.max_targets=0 for distillation.")
  if not 0 <= config.model.max_targets <= config.data.seq_len:
    raise ValueError(f"model.max_targets must be in 0..data.seq_len ({config.data.seq_len}), got "
                     f"{config.model.max_targets}.")
  batches.validate(config)


def eval_rows(config) -> int:
  return config.eval.batch_size or config.data.batch_size // config.optim.grad_accum_steps
