"""The training loop: `train_and_evaluate(config, workdir)`.

    state = train_and_evaluate(config, workdir)        # configs/default.py documents `config`

Flow: validate the config -> Mesh -> abstract state (eval_shape) -> NamedShardings from logical
axis rules -> restore the latest checkpoint, or jit(init, out_shardings) -> jit(train_step,
donate state) over batches sharded on data x fsdp -> metrics stay on device until log steps ->
orbax saves (every N steps, on SIGTERM, at the end) -> params-only export to workdir/export.

Modes: "hamburger" trains the grafted model (`HamburgerModel`, loss of `hamburger_jax.train.losses`,
optionally with the base frozen and/or a distillation term); "base_lm" trains the base Llama alone
with next-token cross-entropy on batches whose groups all have size 1.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.train import batches, checkpoints, sharding
from hamburger_jax.train.run_config import eval_rows, model_config, validate_config
from hamburger_jax.train.metrics_writer import MetricsWriter, Progress
from hamburger_jax.train.setup import Setup
from hamburger_jax.train.step import TrainState, combine_metrics

class StopOnSignal:
  """Context manager: SIGTERM sets `requested` (the loop then saves and exits) instead of killing."""

  def __init__(self):
    self.requested, self._prev = False, None

  def _handle(self, signum, frame):
    del frame
    logging.warning("Signal %d received: saving a checkpoint and stopping.", signum)
    self.requested = True

  def __enter__(self):
    try:
      self._prev = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:            # not the main thread: leave signals alone
      self._prev = None
    return self

  def __exit__(self, *exc):
    if self._prev is not None:
      signal.signal(signal.SIGTERM, self._prev)


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
  """The latest checkpoint of the workdir (state + data position), else a fresh state."""
  step = ckpt.latest_step()
  if step is None:
    return setup.init_state(pretrained)
  saved = ckpt.saved_config(step)
  current = json.loads(setup.config.to_json())
  changed = sorted(k for k, v in current.items() if saved.get(k) != v)
  if changed:
    logging.warning("Resuming step %d with a config that differs in %s.", step, changed)
  state, data_state = ckpt.restore(step, setup.abstract_state())
  train_iter.set_state(data_state)
  logging.info("Resumed from step %d in %s.", step, ckpt.directory)
  return state


def train_and_evaluate(config, workdir: str) -> TrainState:
  """Trains per `config` (see configs/default.py) in `workdir`, resuming its latest checkpoint."""
  sharding.maybe_initialize_distributed(config.distributed)
  validate_config(config)
  mesh = sharding.make_mesh(config.mesh)
  cfg, pretrained = model_config(config), None
  if config.init.checkpoint:
    cfg, pretrained = checkpoints.load_pretrained(config.init.checkpoint, cfg, config.mode)
  setup = Setup(config, cfg, mesh)
  c_cfg = config.checkpoint
  ckpt = checkpoints.Checkpointer(checkpoints.checkpoint_dir(workdir), c_cfg.every_steps,
                                  c_cfg.keep, c_cfg.async_save)
  train_iter = batches.make_iterator(config, cfg, "train")
  state = restore_or_init(setup, ckpt, train_iter, pretrained)
  writer = MetricsWriter(workdir, config.logging.tensorboard)
  start, total = int(jax.device_get(state.step)), config.num_train_steps
  progress = Progress(total, start, config.logging.progress_bar)
  pending, tick, preempted = [], time.time(), False
  try:
    with StopOnSignal() as stop:
      for step in range(start + 1, total + 1):
        batch = next(train_iter)
        batches.check_batch(batch, config.mode)
        state, metrics = setup.train_step(state, batches.to_device(batch, setup.data_sharding))
        pending.append((step, metrics))
        last = step == total
        preempted = (ckpt.reached_preemption(step) if jax.process_count() > 1  # all hosts agree
                     else stop.requested)
        if step % config.logging.every_steps == 0 or last or preempted:
          check_finite(pending, ckpt)
          logged = mean_metrics([m for _, m in pending])
          now = time.time()
          logged["tokens_per_sec"] = logged["tokens"] / max(now - tick, 1e-9)
          writer.write(step, {f"train/{k}": v for k, v in logged.items()})
          progress.update(step, loss=logged["loss"], tok_s=logged["tokens_per_sec"])
          pending, tick = [], now
        if config.eval.every_steps and (step % config.eval.every_steps == 0 or last):
          writer.write(step, {f"eval/{k}": v for k, v in evaluate(setup, state).items()})
          tick = time.time()                  # tokens/s counts training time only
        if step % c_cfg.every_steps == 0 or last or preempted:
          check_finite(pending, ckpt)
          ckpt.save(step, state, json.loads(config.to_json()), train_iter.get_state(), force=True)
        if preempted:
          break
    ckpt.wait()
    if c_cfg.export and not preempted:
      checkpoints.export_params(os.path.join(workdir, "export"), config.mode, cfg, state.params)
  finally:
    ckpt.close()
    writer.close()
    progress.close()
  return state
