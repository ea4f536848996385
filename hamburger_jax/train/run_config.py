"""configs/*.py (ml_collections) -> the model's HamburgerConfig, and validation of a run config.

    cfg = model_config(config)       # frozen HamburgerConfig from model.preset + overrides
    validate_config(config)          # ValueError naming the field, before anything compiles
    config = load_config_file("configs/smollm2.py")   # get_config() of a config file, from Python
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys

import jax

from hamburger_jax.model.config import PRESETS, HamburgerConfig
from hamburger_jax.model.execution import Execution
from hamburger_jax.train import batches, optim, sharding
from hamburger_jax.train.losses import STOP_TARGETS, parse_step_weights

MODES = ("hamburger", "base_lm")


class ConfigError(ValueError):
  """A run setting that cannot work; the message names the field and the fix."""
_BASE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim")
_HAM_FIELDS = ("max_steps", "num_micro_layers", "merger_heads", "merge_adapter_rank")


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
  """Raises ConfigError naming the field for settings that cannot work (before any compile)."""
  try:
    _check_types(config)
    _validate(config, num_devices)
  except ConfigError:
    raise
  except (ValueError, TypeError) as e:
    raise ConfigError(str(e)) from e


def _check_types(config) -> None:
  """Counts and sizes must be ints (not floats, strings or bools); seed in 0..2**32-1."""
  fields = {f"model.{k}": config.model[k] for k in _BASE_FIELDS + _HAM_FIELDS + ("max_targets",)}
  fields.update({"num_train_steps": config.num_train_steps, "seed": config.seed,
                 "data.batch_size": config.data.batch_size, "data.seq_len": config.data.seq_len,
                 "checkpoint.keep": config.checkpoint.keep})
  for name, v in fields.items():
    if isinstance(v, bool) or not isinstance(v, int):
      raise ConfigError(f"{name} must be an integer, got {v!r} ({type(v).__name__}).")
  if not 0 <= config.seed < 2**32:
    raise ConfigError(f"seed must be in 0..2**32-1 (larger seeds would repeat smaller ones), got "
                      f"{config.seed}.")
  if config.checkpoint.keep < 1:
    raise ConfigError(f"checkpoint.keep must be >= 1, got {config.checkpoint.keep}.")


def _validate(config, num_devices: int | None) -> None:
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
  if config.loss.get("stop_target", "segments") not in STOP_TARGETS:
    raise ValueError(f"loss.stop_target must be one of {STOP_TARGETS}, got "
                     f"{config.loss.stop_target!r}.")
  if config.mode == "hamburger":
    parse_step_weights(config.loss.get("step_weights", ""), model_config(config).max_steps)
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
  if not 0 <= config.model.max_targets <= config.data.seq_len:
    raise ValueError(f"model.max_targets must be in 0..data.seq_len ({config.data.seq_len}), got "
                     f"{config.model.max_targets}.")
  batches.validate(config)


def eval_rows(config) -> int:
  return config.eval.batch_size or config.data.batch_size // config.optim.grad_accum_steps



def load_config_file(path: str):
  """The `get_config()` of a configs/*.py file (as train.py's --config reads it), from Python.

  The file's directory parent goes on sys.path so that `from configs import default` resolves.
  """
  path = os.path.abspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"No config file {path}: pass a configs/*.py file.")
  root = os.path.dirname(os.path.dirname(path))
  if root not in sys.path:
    sys.path.insert(0, root)
  spec = importlib.util.spec_from_file_location(f"_config_{abs(hash(path))}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()
