"""The training loop: `train_and_evaluate(config, workdir)`.

    state = train_and_evaluate(config, workdir)        # configs/default.py documents `config`

Flow: validate the config and workdir -> Mesh -> abstract state (eval_shape) -> NamedShardings
from logical axis rules -> restore the newest good checkpoint (it reads, is finite and matches its
digest; newer bad ones are moved to checkpoints/rejected/), or jit(init, out_shardings) ->
jit(train_step, donate state) over batches sharded on data x fsdp -> metrics stay on device until
log steps (then the loss is checked) -> orbax saves of finite states only (every N steps, after
SIGTERM/SIGINT, at the end) -> params-only export to workdir/export.

Modes: "hamburger" trains the grafted model (`HamburgerModel`, loss of `hamburger_jax.train.losses`,
optionally with the base frozen and/or a distillation term); "base_lm" trains the base Llama alone
with next-token cross-entropy on batches whose groups all have size 1.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.train import batches, checkpoints, sharding, workdir_lock
from hamburger_jax.train.run_config import (ConfigError, check_token_ids, eval_rows, model_config,
                                            validate_config)
from hamburger_jax.train.metrics_writer import MetricsWriter, Progress
from hamburger_jax.train.setup import Setup
from hamburger_jax.train.signals import StopOnSignal
from hamburger_jax.train.step import TrainState, combine_metrics


def check_workdir(workdir: str) -> None:
  """ConfigError unless `workdir` is (or can be made) a writable directory that no other run
  holds (`workdir_lock.WorkdirBusy` naming the holder)."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f"--workdir {workdir} is a file, not a directory: pass a directory path.")
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise ConfigError(f"--workdir {workdir} is not writable ({e.strerror}): pass a directory "
                      "you can write to.") from e
  workdir_lock.check_free(workdir)
  try:
    probe = os.path.join(workdir, f".write_test.{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise ConfigError(f"--workdir {workdir} is not writable ({e.strerror}): pass a directory "
                      "you can write to.") from e


def check_finite(pending, ckpt: checkpoints.Checkpointer) -> None:
  """Reads the pending losses; FloatingPointError naming the first step with NaN/inf loss."""
  losses = jax.device_get([m["loss"] for _, m in pending])
  for (step, _), loss in zip(pending, losses):
    if not np.isfinite(loss):
      ckpt.wait()
      raise FloatingPointError(
          f"Loss is {float(loss)} at step {step}: training stopped. The last good checkpoint is "
          f"step {ckpt.latest_step()} in {ckpt.directory}.")


def mean_metrics(metrics: list[dict]) -> dict[str, float]:
  """Token-weighted means of per-step metric dicts (on device or host) -> host floats."""
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *metrics)
  return {k: float(v) for k, v in jax.device_get(combine_metrics(stacked)).items()}


def evaluate(setup: Setup, state: TrainState) -> dict[str, float]:
  """Mean metrics over `eval.num_batches` held-out batches (the same batches every time)."""
  it = batches.make_iterator(setup.config, setup.cfg, "eval", eval_rows(setup.config))
  out = []
  for _ in range(setup.config.eval.num_batches):
    batch = batches.to_device(next(it), setup.data_sharding)
    out.append(setup.eval_step(state.params, batch, state.teacher))
  return mean_metrics(out)


def restore_or_init(setup: Setup, ckpt: checkpoints.Checkpointer, train_iter, pretrained):
  """The newest good checkpoint of the workdir (state + data position), else a fresh state."""
  current = json.loads(setup.config.to_json())
  found = ckpt.restore_latest_good(setup.abstract_state(), current)
  if found is None:
    return setup.init_state(pretrained)
  step, state, data_state = found
  changed = checkpoints.changed_fields(ckpt.saved_config(step), current)
  if changed:
    logging.warning("Resuming step %d with a config that differs in %s.", step, changed)
  train_iter.set_state(data_state)
  logging.info("Resumed from step %d in %s.", step, ckpt.directory)
  return state


def train_and_evaluate(config, workdir: str) -> TrainState:
  """Trains per `config` (see configs/default.py) in `workdir`, resuming its newest good checkpoint.

  Raises ConfigError / CheckpointError / DataError for unusable settings or inputs,
  FloatingPointError when training diverges (nothing non-finite is saved), and
  `signals.Interrupted` after the save that follows a SIGTERM/SIGINT.
  """
  sharding.maybe_initialize_distributed(config.distributed)
  validate_config(config)
  check_workdir(workdir)
  # One writer per workdir: process 0 holds the lock (every host may share the directory).
  with (workdir_lock.WorkdirLock(workdir) if jax.process_index() == 0
        else contextlib.nullcontext()):
    return _run(config, workdir)


def _run(config, workdir: str) -> TrainState:
  """`train_and_evaluate` once the settings and the workdir are checked and held."""
  mesh = sharding.make_mesh(config.mesh)
  cfg, pretrained = model_config(config), None
  if config.init.checkpoint:
    cfg, pretrained = checkpoints.load_pretrained(config.init.checkpoint, cfg, config.mode)
    check_token_ids(cfg, f"init.checkpoint {config.init.checkpoint}")
  batches.check_dataset(config, cfg)
  setup = Setup(config, cfg, mesh)
  c_cfg = config.checkpoint
  ckpt = checkpoints.Checkpointer(checkpoints.checkpoint_dir(workdir), c_cfg.every_steps,
                                  c_cfg.keep, c_cfg.async_save)
  try:
    train_iter = batches.make_iterator(config, cfg, "train")
    state = restore_or_init(setup, ckpt, train_iter, pretrained)
    state = _train(setup, ckpt, train_iter, state, workdir)
    ckpt.wait()
    if c_cfg.export:
      checkpoints.export_params(os.path.join(workdir, "export"), config.mode, cfg, state.params)
  except BaseException:
    ckpt.finish_after_error()
    raise
  ckpt.close()
  return state


def _train(setup: Setup, ckpt: checkpoints.Checkpointer, train_iter, state, workdir: str):
  """Steps from the state's step to num_train_steps: log, evaluate, save (finite states only)."""
  config = setup.config
  start, total = int(jax.device_get(state.step)), config.num_train_steps
  writer = MetricsWriter(workdir, config.logging.tensorboard, resume_step=start)
  progress = Progress(total, start, config.logging.progress_bar)
  log = _StepLog(writer, progress, getattr(train_iter, "pack_stats", None), config.data.seq_len)
  pending = []
  try:
    with StopOnSignal() as stop:
      for step in range(start + 1, total + 1):
        batch = next(train_iter)
        batches.check_batch(batch, config.mode, setup.cfg.base.vocab_size)
        state, metrics = setup.train_step(state, batches.to_device(batch, setup.data_sharding))
        pending.append((step, metrics))
        last = step == total
        preempted = (ckpt.reached_preemption(step) if jax.process_count() > 1  # all hosts agree
                     else stop.requested)
        if step % config.logging.every_steps == 0 or last or preempted:
          check_finite(pending, ckpt)
          log.train(step, [m for _, m in pending])
          pending = []
        if config.eval.every_steps and (step % config.eval.every_steps == 0 or last):
          log.eval(step, evaluate(setup, state))
        if step % config.checkpoint.every_steps == 0 or last or preempted:
          check_finite(pending, ckpt)
          ckpt.save(step, state, json.loads(config.to_json()), train_iter.get_state(), force=True)
        if preempted:
          ckpt.wait()
          stop.signum = stop.signum or signal.SIGTERM
          raise stop.interrupted(step, total, str(ckpt.directory))
  finally:
    writer.close()
    progress.close()
  return state


class _StepLog:
  """Writes train/eval metrics and the packer's counts; warns once when examples are cut."""

  def __init__(self, writer: MetricsWriter, progress: Progress, pack_stats, seq_len: int):
    self.writer, self.progress, self.pack_stats, self.seq_len = writer, progress, pack_stats, seq_len
    self.tick, self.warned = time.time(), False

  def train(self, step: int, metrics: list[dict]) -> None:
    logged = mean_metrics(metrics)
    now = time.time()
    logged["tokens_per_sec"] = logged["tokens"] / max(now - self.tick, 1e-9)
    self.writer.write(step, {f"train/{k}": v for k, v in logged.items()} | self._data())
    self.progress.update(step, loss=logged["loss"], tok_s=logged["tokens_per_sec"])
    self.tick = now

  def eval(self, step: int, metrics: dict) -> None:
    self.writer.write(step, {f"eval/{k}": v for k, v in metrics.items()})
    self.tick = time.time()                  # tokens/s counts training time only

  def _data(self) -> dict[str, float]:
    s = self.pack_stats
    if s is None:
      return {}
    seen = s.examples + s.dropped
    if (s.dropped or s.truncated) and not self.warned:
      self.warned = True
      logging.warning("Packing at data.seq_len=%d: of the %d examples read so far %d were dropped "
                      "(their prompt alone is longer) and %d truncated (trailing groups cut): raise "
                      "data.seq_len to keep them whole.", self.seq_len, seen, s.dropped,
                      s.truncated)
    return {"data/examples_read": seen, "data/dropped": s.dropped, "data/truncated": s.truncated,
            "data/fill": s.fill}
