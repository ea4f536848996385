"""Training: TrainState, the jitted train/eval steps and the `train_and_evaluate` loop.

    state = train_and_evaluate(config, workdir)        # configs/default.py documents `config`

Flow: validate the config -> Mesh -> abstract state (eval_shape) -> NamedShardings from logical
axis rules -> restore the latest checkpoint, or jit(init, out_shardings) -> jit(train_step,
donate state) over batches sharded on data x fsdp -> metrics stay on device until log steps ->
orbax saves (every N steps, on SIGTERM, at the end) -> params-only export to workdir/export.

Modes: "hamburger" trains the grafted model (`HamburgerModel`, loss of `hamburger_jax.losses`,
optionally with the base frozen and/or a distillation term); "base_lm" trains the base Llama alone
with next-token cross-entropy on batches whose groups all have size 1.

Distillation (loss.kl_weight > 0): the teacher is the base model as it was at the start (the live
base params when the base is frozen, else a copy kept in the state and checkpoint). Its logits are
computed on device inside the step: `plain_view` rebuilds the plain, unmerged token rows of the
packed batch (loss.teacher_len tokens per row, default seq_len * max_steps; targets past that are
left out of the KL) and one more base forward over them gives the teacher's distribution for every
target token. Nothing is added to the batch on the host.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from hamburger_jax import checkpoints, optim, sharding, train_data
from hamburger_jax.config import PRESETS, HamburgerConfig
from hamburger_jax.llama import LlamaModel, init_llama_params
from hamburger_jax.losses import hamburger_loss, kl_to_teacher, masked_mean, target_masks
from hamburger_jax.metrics_writer import MetricsWriter, Progress
from hamburger_jax.model import HamburgerModel, init_params

MODES = ("hamburger", "base_lm")
_BASE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim")
_HAM_FIELDS = ("max_steps", "num_micro_layers", "merger_heads")


@struct.dataclass
class TrainState:
  step: jax.Array        # int32 []: optimizer steps taken
  params: Any            # {"base", "embedder", "micro_decoder"} ({"base"} in mode base_lm)
  opt_state: Any         # optax state of the trainable sub-tree only
  teacher: Any = None    # base params at start (distillation with a trained base), else None


# --- config ---------------------------------------------------------------------------------------

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
  train_data.validate(config)


def eval_rows(config) -> int:
  return config.eval.batch_size or config.data.batch_size // config.optim.grad_accum_steps


# --- losses ---------------------------------------------------------------------------------------

def base_lm_loss(base_cfg, params, batch):
  """Next-token CE of the base model on size-1 groups -> (loss, metrics)."""
  out = LlamaModel(base_cfg).apply({"params": params["base"]}, batch["group_tokens"][..., 0],
                                   positions=batch["positions"], segment_ids=batch["segment_ids"])
  targets, mask = batch["target_tokens"][..., 0], batch["target_lengths"] > 0
  ce = optax.softmax_cross_entropy_with_integer_labels(out.logits, targets)
  loss = masked_mean(ce, mask)
  acc = masked_mean(jnp.argmax(out.logits, -1) == targets, mask)
  return loss, {"loss": loss, "label_loss": loss, "perplexity": jnp.exp(loss), "accuracy": acc,
                "accuracy_s1": acc, "tokens": jnp.sum(mask).astype(jnp.float32)}


def plain_view(batch, plain_len: int):
  """Rebuilds the plain (unmerged) token rows of a packed batch, for the distillation teacher.

  -> (plain {"tokens", "positions", "segment_ids"} each [B, P], slot [B, M, S]: the plain index
  whose next-token prediction is target (m, j), valid [B, M, S]: target exists and fits in P).
  Each macro position m reserves its input tokens, plus the final target group of its example.
  """
  gl, tl, seg, pos = (batch[k] for k in ("group_lengths", "target_lengths", "segment_ids",
                                         "positions"))
  b, s = gl.shape[0], batch["group_tokens"].shape[-1]
  k = jnp.arange(s)
  last = (tl > 0) & (seg != jnp.pad(seg[:, 1:], ((0, 0), (0, 1))))   # example's final group
  reserved = gl + jnp.where(last, tl, 0)
  start = (jnp.cumsum(reserved, axis=1) - reserved)[..., None]        # [B, M, 1]
  in_ok, out_ok = k < gl[..., None], last[..., None] & (k < tl[..., None])
  slots = jnp.concatenate([jnp.where(in_ok, start + k, plain_len),
                           jnp.where(out_ok, start + gl[..., None] + k, plain_len)], -1)
  values = {"tokens": jnp.concatenate([batch["group_tokens"], batch["target_tokens"]], -1),
            "positions": jnp.concatenate([pos[..., None] - gl[..., None] + 1 + k,
                                          pos[..., None] + 1 + k], -1),
            "segment_ids": jnp.broadcast_to(seg[..., None], slots.shape)}
  rows = jnp.arange(b)[:, None, None]
  plain = {n: jnp.zeros((b, plain_len), jnp.int32).at[rows, slots].set(v, mode="drop")
           for n, v in values.items()}
  slot = start + gl[..., None] - 1 + k
  return plain, slot, (k < tl[..., None]) & (slot < plain_len)


def teacher_logits(base_cfg, teacher_params, batch, plain_len: int):
  """The teacher's next-token logits for every target token -> ([B, M, S, V], valid [B, M, S])."""
  plain, slot, valid = plain_view(batch, plain_len)
  out = LlamaModel(base_cfg).apply({"params": teacher_params}, plain["tokens"],
                                   positions=plain["positions"], segment_ids=plain["segment_ids"])
  b, m, s = slot.shape
  idx = jnp.minimum(slot, plain_len - 1).reshape(b, m * s)
  logits = jnp.take_along_axis(out.logits, idx[..., None], axis=1)
  return jax.lax.stop_gradient(logits.reshape(b, m, s, -1)), valid


def expected_tokens_per_step(stop_logits, target_lengths):
  """Mean over predicting positions of E[group size] = sum_j prod_{i<j} P(continue at i)."""
  cont = 1.0 - jax.nn.sigmoid(stop_logits.astype(jnp.float32))                   # [B, M, S]
  reach = jnp.cumprod(jnp.concatenate([jnp.ones_like(cont[..., :1]), cont[..., :-1]], -1), -1)
  return masked_mean(reach.sum(-1), target_lengths > 0)


def hamburger_train_loss(cfg: HamburgerConfig, loss_cfg, plain_len, max_targets, params, batch,
                         teacher):
  """HAMburger loss (+ kl_weight x KL to the teacher) -> (loss, metrics).

  max_targets (static, None = all): the micro decoder runs only on that many target positions
  per row (see HamburgerModel.__call__); positions past it are counted in `targets_dropped`.
  """
  out = HamburgerModel(cfg).apply({"params": params}, batch, max_targets=max_targets)
  loss, metrics = hamburger_loss(out.logits, out.stop_logits, out.target_tokens,
                                 out.target_lengths, stop_weight=loss_cfg.stop_weight)
  if max_targets is not None:
    metrics["targets_dropped"] = (jnp.sum(batch["target_lengths"] > 0)
                                  - jnp.sum(out.target_lengths > 0)).astype(jnp.float32)
  if loss_cfg.kl_weight:
    t_params = params["base"] if teacher is None else teacher
    t_logits, valid = teacher_logits(cfg.base, jax.lax.stop_gradient(t_params), batch, plain_len)
    mask = target_masks(batch["target_lengths"], cfg.max_steps)[0] & valid
    metrics["kl"] = masked_mean(kl_to_teacher(out.logits, t_logits), mask)
    loss = loss + loss_cfg.kl_weight * metrics["kl"]
    metrics["loss"] = loss
  metrics["expected_tokens_per_step"] = expected_tokens_per_step(out.stop_logits,
                                                                 out.target_lengths)
  return loss, metrics


def make_loss_fn(config, cfg: HamburgerConfig):
  """-> loss_fn(params, batch, teacher) -> (scalar loss, metrics dict) for `config.mode`."""
  if config.mode == "base_lm":
    return lambda params, batch, teacher: base_lm_loss(cfg.base, params, batch)
  plain_len = config.loss.teacher_len or config.data.seq_len * cfg.max_steps
  max_targets = config.model.max_targets or None
  return functools.partial(hamburger_train_loss, cfg, config.loss, plain_len, max_targets)


# --- steps ------------------------------------------------------------------------------------------

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


# --- state ------------------------------------------------------------------------------------------

def init_model_params(config, cfg: HamburgerConfig, rng, boxed: bool = False):
  """Random params of `config.mode`: the full HAMburger tree or {"base": ...}."""
  if config.mode == "base_lm":
    return {"base": init_llama_params(cfg.base, rng, boxed=boxed)}
  return init_params(cfg, rng, boxed=boxed)


class Setup:
  """What the loop needs, built once: shardings, abstract state, jitted init/train/eval steps."""

  def __init__(self, config, cfg: HamburgerConfig, mesh):
    self.config, self.cfg, self.mesh = config, cfg, mesh
    self.trainable = optim.trainable_keys(config.mode, config.freeze_base)
    self.tx = optim.make_optimizer(config.optim, config.num_train_steps)
    self.use_teacher = (config.mode == "hamburger" and bool(config.loss.kl_weight)
                        and "base" in self.trainable)
    rng = jax.random.PRNGKey(config.seed)
    boxed = jax.eval_shape(lambda: init_model_params(config, cfg, rng, boxed=True))
    p_shard = sharding.logical_shardings(boxed, mesh, config.logical_axis_rules)
    self.abstract = jax.eval_shape(self._init_state, rng)
    o_shard = sharding.opt_state_shardings(self.abstract.opt_state, p_shard,
                                           self.abstract.params, mesh)
    self.shardings = TrainState(step=sharding.replicated(mesh), params=p_shard, opt_state=o_shard,
                                teacher=p_shard["base"] if self.use_teacher else None)
    self.data_sharding = sharding.batch_sharding(mesh)
    loss_fn = make_loss_fn(config, cfg)
    step_fn = functools.partial(
        train_step, loss_fn=loss_fn, tx=self.tx, trainable=self.trainable,
        accum_steps=config.optim.grad_accum_steps,
        micro_sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
            sharding.BATCH_AXES)), lr_fns=optim.schedules(config.optim, config.num_train_steps))
    self.train_step = jax.jit(step_fn, in_shardings=(self.shardings, self.data_sharding),
                              out_shardings=(self.shardings, sharding.replicated(mesh)),
                              donate_argnums=0)
    self.eval_step = jax.jit(functools.partial(eval_step, loss_fn=loss_fn),
                             in_shardings=(p_shard, self.data_sharding, self.shardings.teacher),
                             out_shardings=sharding.replicated(mesh))

  def _init_state(self, rng) -> TrainState:
    params = init_model_params(self.config, self.cfg, rng)
    train_p, _ = optim.split_params(params, self.trainable)
    teacher = jax.tree.map(jnp.copy, params["base"]) if self.use_teacher else None
    return TrainState(jnp.zeros((), jnp.int32), params, self.tx.init(train_p), teacher)

  def init_state(self, pretrained: dict | None = None) -> TrainState:
    """A fresh state created already sharded; `pretrained` sub-trees replace the random init."""
    state = jax.jit(self._init_state, out_shardings=self.shardings)(
        jax.random.PRNGKey(self.config.seed))
    if not pretrained:
      return state
    params = dict(state.params)
    for key, tree in pretrained.items():
      params[key] = place(tree, self.abstract.params[key], self.shardings.params[key], key)
    teacher = (place(pretrained["base"], self.abstract.params["base"],
                     self.shardings.params["base"], "base")
               if self.use_teacher and "base" in pretrained else state.teacher)
    return state.replace(params=params, teacher=teacher)

  def abstract_state(self):
    return checkpoints.abstract_with_shardings(self.abstract, self.shardings)


def place(tree, abstract, shardings, name: str):
  """Host arrays -> device arrays of the abstract dtypes/shardings; ValueError on a shape mismatch."""
  def put(path, x, a, s):
    if tuple(np.shape(x)) != tuple(a.shape):
      raise ValueError(f"Checkpoint param {name}{jax.tree_util.keystr(path)} has shape "
                       f"{np.shape(x)}, the model expects {a.shape}.")
    return jax.make_array_from_callback(a.shape, s, lambda idx: np.asarray(x, a.dtype)[idx])
  return jax.tree_util.tree_map_with_path(put, tree, abstract, shardings)


# --- loop -------------------------------------------------------------------------------------------

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


def mean_metrics(host_metrics: list[dict]) -> dict[str, float]:
  """Token-weighted means of a list of metric dicts (host numpy); tokens are summed."""
  tokens = np.array([m["tokens"] for m in host_metrics], np.float64)
  w = tokens / max(tokens.sum(), 1.0)
  out = {k: float(sum(wi * float(m[k]) for wi, m in zip(w, host_metrics)))
         for k in host_metrics[0]}
  out["tokens"] = float(tokens.sum())
  out["perplexity"] = float(np.exp(out["label_loss"]))
  return out


def evaluate(setup: Setup, state: TrainState) -> dict[str, float]:
  """Mean metrics over `eval.num_batches` held-out batches (the same batches every time)."""
  it = train_data.make_iterator(setup.config, setup.cfg, "eval", eval_rows(setup.config))
  out = []
  for _ in range(setup.config.eval.num_batches):
    batch = train_data.to_device(next(it), setup.data_sharding)
    out.append(setup.eval_step(state.params, batch, state.teacher))
  return mean_metrics(jax.device_get(out))


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
  train_iter = train_data.make_iterator(config, cfg, "train")
  state = restore_or_init(setup, ckpt, train_iter, pretrained)
  writer = MetricsWriter(workdir, config.logging.tensorboard)
  start, total = int(jax.device_get(state.step)), config.num_train_steps
  progress = Progress(total, start, config.logging.progress_bar)
  pending, tick, preempted = [], time.time(), False
  try:
    with StopOnSignal() as stop:
      for step in range(start + 1, total + 1):
        batch = next(train_iter)
        train_data.check_batch(batch, config.mode)
        state, metrics = setup.train_step(state, train_data.to_device(batch, setup.data_sharding))
        pending.append((step, metrics))
        last = step == total
        preempted = (ckpt.reached_preemption(step) if jax.process_count() > 1  # all hosts agree
                     else stop.requested)
        if step % config.logging.every_steps == 0 or last or preempted:
          check_finite(pending, ckpt)
          logged = mean_metrics(jax.device_get([m for _, m in pending]))
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
