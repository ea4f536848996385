"""Training checkpoints (orbax), the params-only export, and loading of a starting checkpoint.

A training checkpoint `workdir/checkpoints/<step>/` holds three items:
    state   the TrainState (params, optimizer state, step), restored already sharded
    config  the experiment ConfigDict as JSON (the checkpoint describes itself)
    data    the data iterator's state (JSON, one file per process, through grain's orbax
            handler), so a restart reads the next batch, not the first
Saves are asynchronous and atomic (orbax writes a temporary directory and renames it when
complete), so a kill during a save leaves the previous checkpoint loadable.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp
from etils import epath

from hamburger_jax.model.config import HamburgerConfig
from hamburger_jax.convert import export_hf_llama, load_model, save_hamburger

ITEMS = ("state", "config", "data")


class DataState:
  """A data iterator's JSON-able state, frozen when the save starts (saves run in the background).

  Saved through `grain.checkpoint.CheckpointHandler` (one JSON file per process), so multi-host
  jobs keep every host's position.
  """

  def __init__(self, state: Any = None):
    self.state = copy.deepcopy(state)

  def get_state(self) -> bytes:
    return json.dumps(self.state).encode()

  def set_state(self, raw: bytes) -> None:
    self.state = json.loads(raw)

  def start_prefetch(self) -> None:
    pass


class Checkpointer:
  """An orbax CheckpointManager for (state, config JSON, data state); keeps the last `keep`."""

  def __init__(self, directory: str, save_every: int, keep: int, async_save: bool = True):
    self.directory = epath.Path(directory).absolute()
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=max(1, save_every), max_to_keep=keep, create=True,
        enable_async_checkpointing=async_save, cleanup_tmp_directories=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state, config_dict: dict, data_state: Any, force: bool = False) -> bool:
    """Starts an async save (if `step` is a save step, or `force`); returns whether it did."""
    args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                              config=ocp.args.JsonSave(config_dict),
                              data=grain.checkpoint.CheckpointSave(DataState(data_state)))
    return self.manager.save(step, args=args, force=force)

  def restore(self, step: int, abstract_state) -> tuple[Any, Any]:
    """-> (state placed with the shardings of `abstract_state`, data state dict)."""
    args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                              data=grain.checkpoint.CheckpointRestore(DataState()))
    out = self.manager.restore(step, args=args)
    return out["state"], out["data"].state

  def saved_config(self, step: int) -> dict:
    return dict(self.manager.restore(step, args=ocp.args.Composite(
        config=ocp.args.JsonRestore()))["config"])

  def reached_preemption(self, step: int) -> bool:
    """True on every host once the job is being preempted (multi-host jobs)."""
    return bool(self.manager.reached_preemption(step))

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def abstract_with_shardings(tree, shardings):
  """ShapeDtypeStructs carrying shardings: the restore target of a sharded state."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      tree, shardings)


# --- params-only export -------------------------------------------------------------------------

def to_host(tree):
  """Device arrays -> numpy, gathering shards across hosts when needed."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    return multihost_utils.process_allgather(tree, tiled=True)
  return jax.device_get(tree)


def export_params(directory: str, mode: str, cfg: HamburgerConfig, params) -> str:
  """Writes the params-only export that `decode.py` loads (process 0 writes; all gather).

  mode "hamburger": this project's format (`hamburger_jax.convert.save_hamburger`);
  mode "base_lm": an HF Llama directory (`export_hf_llama`), usable as a fine-tuning base.
  """
  host = to_host(params)
  if jax.process_index() == 0:
    if mode == "base_lm":
      export_hf_llama(cfg.base, host["base"], directory)
    else:
      save_hamburger(directory, cfg, host)
  return directory


# --- starting checkpoint ------------------------------------------------------------------------

def load_pretrained(path: str, cfg: HamburgerConfig, mode: str) -> tuple[HamburgerConfig, dict]:
  """Opens a starting checkpoint -> (model config, params subtree to graft onto a fresh init).

  An HF Llama directory gives the base model only (grafted modules stay random): the HAMburger
  fields (max_steps, feature_layers, ...) come from `cfg`. A HAMburger checkpoint gives all params
  and its own architecture (mode "base_lm" keeps only its base). dtypes always come from `cfg`.
  """
  kind, ckpt_cfg, params = load_model(path)
  dtypes = dict(param_dtype=cfg.base.param_dtype, dtype=cfg.base.dtype)
  if kind == "llama":
    base = dataclasses.replace(ckpt_cfg, **dtypes)
    new_cfg = cfg.replace(base=base)
    loaded = {"base": params}
  else:
    new_cfg = ckpt_cfg.replace(base=dataclasses.replace(ckpt_cfg.base, **dtypes))
    loaded = {"base": params["base"]} if mode == "base_lm" else dict(params)
  if new_cfg != cfg:
    logging.info("Model architecture taken from the checkpoint %s: %s", path, new_cfg)
  return new_cfg, loaded


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(workdir, "checkpoints")
