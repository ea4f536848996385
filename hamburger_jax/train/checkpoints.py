"""Training checkpoints (orbax), the params-only export, and loading of a starting checkpoint.

A training checkpoint `workdir/checkpoints/<step>/` holds four items:
    state      the TrainState (params, optimizer state, step), restored already sharded
    config     the experiment ConfigDict as JSON (the checkpoint describes itself)
    data       the data iterator's state (JSON, one file per process, through grain's orbax
               handler), so a restart reads the next batch, not the first
    integrity  the digest of the state's bits (`integrity.inspect`), checked on restore
Saves are asynchronous and atomic (orbax writes a temporary directory and renames it when
complete), so a kill during a save leaves the previous checkpoint loadable. A non-finite state is
never saved; a restore walks back from the newest step to the newest one that reads, is finite and
matches its digest, moving the bad ones to `checkpoints/rejected/`.
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
from hamburger_jax.train import integrity

ITEMS = ("state", "config", "data", "integrity")
REJECTED_DIR = "rejected"     # workdir/checkpoints/rejected/<step>: checkpoints that failed checks


class NonFiniteStateError(FloatingPointError):
  """The state to save holds NaN/inf: it is not saved (the message names leaves and last good step)."""


class RestoreError(ValueError):
  """No checkpoint of the workdir can be restored (each one's problem is named)."""


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
  """An orbax CheckpointManager for (state, config JSON, data state, integrity record).

  Only finite states are saved, each with the digest of `integrity.inspect`. Old steps are deleted
  here, not by orbax: once `keep` newer saves have completed, so a save that fails or is cut short
  never costs the last good checkpoint.
  """

  def __init__(self, directory: str, save_every: int, keep: int, async_save: bool = True):
    self.directory = epath.Path(directory).absolute()
    self.keep = max(1, keep)
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=max(1, save_every), max_to_keep=None, create=True,
        enable_async_checkpointing=async_save, cleanup_tmp_directories=True)
    handlers = {"state": ocp.StandardCheckpointHandler(), "config": ocp.JsonCheckpointHandler(),
                "data": grain.checkpoint.CheckpointHandler(),
                "integrity": ocp.JsonCheckpointHandler()}
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def save(self, step: int, state, config_dict: dict, data_state: Any, force: bool = False) -> bool:
    """Starts an async save of a finite `state` (if `step` is a save step, or `force`).

    Raises NonFiniteStateError, saving nothing, if the state holds NaN/inf.
    """
    if not (force or self.manager.should_save(step)):
      return False
    report = integrity.inspect(state)
    if not report.finite:
      self.wait()
      bad = report.bad_leaves
      raise NonFiniteStateError(
          f"The state after step {step} holds NaN/inf in {len(bad)} arrays ({bad[0]}, ...): "
          f"training stopped without saving it. The last good checkpoint is step "
          f"{self.latest_step()} in {self.directory}.")
    record = {"step": step, "digest": [list(d) for d in report.digest]}
    args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                              config=ocp.args.JsonSave(config_dict),
                              data=grain.checkpoint.CheckpointSave(DataState(data_state)),
                              integrity=ocp.args.JsonSave(record))
    saved = self.manager.save(step, args=args, force=True)
    self.prune()
    return saved

  def prune(self) -> None:
    """Deletes completed steps older than the newest `keep` completed ones (in-flight not counted)."""
    self.manager.reload()
    for step in self.all_steps()[:-self.keep]:
      self.manager.delete(step)

  def restore(self, step: int, abstract_state) -> tuple[Any, Any]:
    """-> (state placed with the shardings of `abstract_state`, data state dict), unchecked."""
    args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                              data=grain.checkpoint.CheckpointRestore(DataState()))
    out = self.manager.restore(step, args=args)
    return out["state"], out["data"].state

  def verify(self, step: int, state) -> str | None:
    """What is wrong with a restored `state` of `step` (non-finite, digest mismatch), or None."""
    report = integrity.inspect(state)
    if not report.finite:
      return f"holds NaN/inf in {report.bad_leaves[:3]}"
    if not (self.directory / str(step) / "integrity").exists():
      return None                    # saved before integrity records existed
    record = self.manager.restore(step, args=ocp.args.Composite(
        integrity=ocp.args.JsonRestore()))["integrity"]
    leaf = report.mismatch(record["digest"])
    return None if leaf is None else f"does not match its saved digest (first in {leaf})"

  def restore_latest_good(self, abstract_state, config_dict: dict | None = None
                          ) -> tuple[int, Any, Any] | None:
    """The newest step that reads and passes `verify` -> (step, state, data state); None if the
    workdir has no checkpoint. Newer bad steps are moved to `rejected/` with a warning naming
    them; if no step is good, nothing is moved and RestoreError lists every problem. A step
    whose arrays differ in name or shape from `abstract_state` (another model or mode) is a
    RestoreError naming them and the `config_dict` fields that changed."""
    problems = []
    for step in reversed(self.all_steps()):
      self.check_same_model(step, abstract_state, config_dict)
      try:
        state, data = self.restore(step, abstract_state)
        problem = self.verify(step, state)
      except Exception as e:  # orbax/tensorstore raise many types for unreadable files
        problem = f"cannot be read ({type(e).__name__}: {_first_line(e)})"
      if problem is None:
        for bad, why in problems:
          self.reject(bad, why)
        return step, state, data
      problems.append((step, problem))
    if problems:
      raise RestoreError(f"No checkpoint in {self.directory} can be restored: " + "; ".join(
          f"step {s} {why}" for s, why in problems) + ". Move them away to start afresh.")
    return None

  def check_same_model(self, step: int, abstract_state, config_dict: dict | None) -> None:
    """RestoreError if the params saved at `step` differ in names or shapes from the model's."""
    try:
      saved = self.manager.item_metadata(step)["state"]["params"]
    except Exception:  # unreadable metadata: the restore itself reports it
      return
    params = (abstract_state["params"] if isinstance(abstract_state, dict)
              else abstract_state.params)
    want = _shapes(params)
    have = _shapes(saved)
    diff = sorted(set(want) ^ set(have)) or [k for k in want if want[k] != have[k]]
    if not diff:
      return
    key = diff[0]
    detail = (f"{key} has shape {have[key]} there, {want[key]} in this model" if key in have
              and key in want else f"{key} is only in the {'model' if key in want else 'checkpoint'}")
    changed = changed_fields(self.saved_config(step), config_dict) if config_dict else []
    raise RestoreError(
        f"{self.directory} holds checkpoints of another model or mode (step {step}: {detail}; "
        f"{len(diff)} arrays differ; config fields changed: {changed or 'none'}). Use a new "
        "--workdir, or the settings of that run.")

  def reject(self, step: int, why: str) -> None:
    """Moves a bad step to `rejected/` (kept for inspection, out of orbax's way)."""
    target = self.directory / REJECTED_DIR / str(step)
    if jax.process_index() == 0:
      target.parent.mkdir(parents=True, exist_ok=True)
      n = 1
      while target.exists():
        target, n = self.directory / REJECTED_DIR / f"{step}.{n}", n + 1
      (self.directory / str(step)).rename(target)
    logging.warning("Checkpoint step %d in %s %s: skipped and moved to %s.", step, self.directory,
                    why, target)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices(f"reject_checkpoint_{step}")
    self.manager.reload()

  def saved_config(self, step: int) -> dict:
    return dict(self.manager.restore(step, args=ocp.args.Composite(
        config=ocp.args.JsonRestore()))["config"])

  def reached_preemption(self, step: int) -> bool:
    """True on every host once the job is being preempted (multi-host jobs)."""
    return bool(self.manager.reached_preemption(step))

  def wait(self) -> None:
    """Waits for the save in flight, then deletes steps beyond `keep`."""
    self.manager.wait_until_finished()
    self.prune()

  def close(self) -> None:
    self.wait()
    self.manager.close()

  def finish_after_error(self) -> None:
    """Lets a save in flight complete (a good step is not lost); its own failure (a full disk) is
    logged, not raised over the error being handled. The manager stays open: closing it under
    failed background writes makes tensorstore print tracebacks."""
    try:
      self.wait()
    except Exception as e:  # the error in flight is the one that matters
      logging.warning("The checkpoint save in progress failed too: %s", _first_line(e))


def _shapes(tree) -> dict[str, tuple]:
  return {jax.tree_util.keystr(p): tuple(x.shape)
          for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out


def changed_fields(saved: dict, current: dict) -> list[str]:
  """Dotted config fields whose values differ between two config JSON dicts."""
  a, b = _flat(saved), _flat(current)
  return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return text[0][:300] if text else ""


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
  and its own architecture (mode "base_lm" keeps only its base); a merge adapter that `cfg` asks
  for and the checkpoint lacks starts fresh (as the identity). dtypes always come from `cfg`.
  """
  kind, ckpt_cfg, params = load_model(path)
  dtypes = dict(param_dtype=cfg.base.param_dtype, dtype=cfg.base.dtype)
  if kind == "llama":
    base = dataclasses.replace(ckpt_cfg, **dtypes)
    new_cfg = cfg.replace(base=base)
    loaded = {"base": params}
  else:
    new_cfg = ckpt_cfg.replace(base=dataclasses.replace(ckpt_cfg.base, **dtypes))
    if cfg.merge_adapter_rank and not ckpt_cfg.merge_adapter_rank:
      new_cfg = new_cfg.replace(merge_adapter_rank=cfg.merge_adapter_rank)  # fresh (= identity)
    loaded = {"base": params["base"]} if mode == "base_lm" else dict(params)
  if new_cfg != cfg:
    logging.info("Model architecture taken from the checkpoint %s: %s", path, new_cfg)
  return new_cfg, loaded


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(workdir, "checkpoints")
