"""configs/*.py (ml_collections) -> the model's HamburgerConfig, and validation of a run config.

    cfg = model_config(config)       # frozen HamburgerConfig from model.preset + overrides
    validate_config(config)          # ValueError naming the field, before anything compiles
    config = load_config_file("configs/smollm2.py")   # get_config() of a config file, from Python
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
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
    _check_ranges(config)
    _validate(config, num_devices)
    check_token_ids(model_config(config), f"model.preset {config.model.preset!r}")
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


# Real-valued settings: (field, lowest, highest, highest excluded); every one must be finite.
_REAL_RANGES = (
    ("optim.base_lr", 0.0, math.inf, False), ("optim.grafted_lr", 0.0, math.inf, False),
    ("optim.end_lr", 0.0, math.inf, False), ("optim.b1", 0.0, 1.0, True),
    ("optim.b2", 0.0, 1.0, True), ("optim.eps", 0.0, math.inf, False),
    ("optim.weight_decay", 0.0, math.inf, False), ("optim.grad_clip_norm", 0.0, math.inf, False),
    ("loss.stop_weight", 0.0, math.inf, False), ("loss.kl_weight", 0.0, math.inf, False))
# Integer settings and their least value (0 = "off" or "the preset's" where the config says so).
_INT_MINIMA = (("data.batch_size", 1), ("data.seq_len", 1), ("data.num_workers", 0),
               ("optim.warmup_steps", 0), ("loss.teacher_len", 0), ("eval.every_steps", 0),
               ("eval.num_batches", 1), ("eval.batch_size", 0), ("model.attention_block", 1),
               ("model.max_targets", 0)) + tuple((f"model.{k}", 0)
                                                 for k in _BASE_FIELDS + _HAM_FIELDS)


def _field(config, name: str):
  for part in name.split("."):
    config = config[part]
  return config


def _check_ranges(config) -> None:
  """Learning rates, betas, weights finite and in range (NaN refused); sizes and counts >= their
  least value; ConfigError naming the field and the fix."""
  for name, lo, hi, hi_open in _REAL_RANGES:
    v = _field(config, name)
    span = f"in [{lo:g}, {hi:g}{')' if hi_open else ']'}" if hi < math.inf else f">= {lo:g}"
    ok = (not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
          and lo <= v and (v < hi if hi_open else v <= hi))
    if not ok:
      raise ConfigError(f"{name} must be a finite number {span}, got {v!r}: set "
                        f"--config.{name} to such a value.")
  for name, low in _INT_MINIMA:
    v = _field(config, name)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
      raise ConfigError(f"{name} must be an integer >= {low}, got {v!r}: set --config.{name} to "
                        "such a value.")


def check_token_ids(cfg: HamburgerConfig, source: str) -> None:
  """ConfigError unless the BOS and EOS ids of `cfg` lie in its vocabulary (an EOS outside it
  could never end a sequence)."""
  base = cfg.base
  ids = [("eos_token_ids", i) for i in base.eos_token_ids]
  if base.bos_token_id is not None:
    ids.append(("bos_token_id", base.bos_token_id))
  bad = [(name, i) for name, i in ids if not 0 <= int(i) < base.vocab_size]
  if bad:
    name, i = bad[0]
    raise ConfigError(f"{name} holds {i}, outside the vocabulary of {base.vocab_size} tokens of "
                      f"{source}: fix the ids in its config (each in 0..{base.vocab_size - 1}).")


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

  When `configs` is not importable, the `configs` package beside the file's directory is
  registered under that name, so that `from configs import default` resolves.
  """
  path = os.path.abspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"No config file {path}: pass a configs/*.py file.")
  _register_configs(os.path.join(os.path.dirname(os.path.dirname(path)), "configs"))
  spec = importlib.util.spec_from_file_location(f"_config_{abs(hash(path))}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _register_configs(directory: str) -> None:
  """Imports `directory`/__init__.py as the package `configs` unless one is importable."""
  init = os.path.join(directory, "__init__.py")
  if ("configs" in sys.modules or not os.path.isfile(init)
      or importlib.util.find_spec("configs") is not None):
    return
  spec = importlib.util.spec_from_file_location("configs", init,
                                                submodule_search_locations=[directory])
  module = importlib.util.module_from_spec(spec)
  sys.modules["configs"] = module
  spec.loader.exec_module(module)
