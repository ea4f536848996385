"""Every training loss: HAMburger's masked CE + stop_weight x stop BCE, KL to the base model
(distillation), and plain next-token CE for the base alone; each -> (loss, metrics).

HAMburger inputs are per macro position and micro step: logits [B, M, S, V], stop logits
[B, M, S], target tokens [B, M, S] and target lengths [B, M] (0 = no target). Means are over real
tokens.

Distillation (loss.kl_weight > 0): the teacher is the base model as it was at the start (the live
base params when the base is frozen, else a copy kept in the state and checkpoint). Its logits are
computed on device inside the step: `plain_view` rebuilds the plain, unmerged token rows of the
packed batch (loss.teacher_len tokens per row, default seq_len * max_steps; targets past that are
left out of the KL) and one more base forward over them gives the teacher's distribution for every
target token. Nothing is added to the batch on the host.

Memory (config `loss.chunk_size`, `model.attention` / `remat` / `scan_layers`): with
chunk_size > 0 the micro decoder, the heads and the per-token losses run on chunks of macro
positions under `jax.checkpoint` (`chunked_map`), so float32 [B, M, S, V] logits and the micro
decoder's [B * M, F + S - 1, ...] activations never exist at once; same numbers.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax

from hamburger_jax.model.config import HamburgerConfig
from hamburger_jax.model.execution import Execution
from hamburger_jax.model.hamburger import HamburgerModel, gather_target_positions
from hamburger_jax.model.llama import LlamaModel
from hamburger_jax.train.token_stats import kl_to_teacher  # noqa: F401  (re-exported)
from hamburger_jax.train.token_stats import chunked_map, stats_from_logits, vocab_constrained


STOP_TARGETS = ("segments", "correct")


def target_masks(target_lengths, max_steps: int):
  """-> (token mask [B, M, S]: j < length, stop targets [B, M, S]: j == length - 1)."""
  j = jnp.arange(max_steps)
  lengths = target_lengths[..., None]
  return j < lengths, (j == lengths - 1).astype(jnp.float32)


def stop_targets_from(target_lengths, correct, stop_target: str = "segments"):
  """Stop-head targets [B, M, S].

  "segments": stop after the group's last token (j == length - 1), the segmentation alone.
  "correct": also stop after token j when the micro decoder's teacher-forced prediction of token
  j + 1 is wrong (`correct` [B, M, S], 1 = argmax equals the target), so the stop head learns
  where the drafted continuation can be trusted, not only where the base was confident.
  """
  if stop_target not in STOP_TARGETS:
    raise ValueError(f"loss.stop_target must be one of {STOP_TARGETS}, got {stop_target!r}.")
  mask, at_end = target_masks(target_lengths, correct.shape[-1])
  if stop_target == "segments":
    return at_end
  next_wrong = 1.0 - jnp.pad(correct[..., 1:].astype(jnp.float32), ((0, 0),) * (correct.ndim - 1)
                             + ((0, 1),))
  inside = (jnp.arange(correct.shape[-1]) < target_lengths[..., None] - 1) & mask
  return jnp.maximum(at_end, jax.lax.stop_gradient(next_wrong) * inside)


def masked_mean(x, mask):
  mask = mask.astype(jnp.float32)
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def hamburger_loss(logits, stop_logits, target_tokens, target_lengths, stop_weight: float = 0.5,
                   stop_target: str = "segments"):
  """CE + stop_weight x stop BCE -> (loss scalar, metrics dict of on-device scalars)."""
  stats = stats_from_logits(logits, target_tokens)
  return hamburger_loss_from_stats(stats, stop_logits, target_lengths, stop_weight, stop_target)


def parse_step_weights(spec: str, max_steps: int) -> tuple[float, ...] | None:
  """loss.step_weights: "" (every micro step's CE counts alike) or max_steps comma-separated
  weights >= 0, not all zero, e.g. "4,1,1,1" (step 0, the base's own next token, counts 4x)."""
  if not spec:
    return None
  try:
    weights = tuple(float(w) for w in spec.split(","))
  except ValueError:
    weights = ()
  if len(weights) != max_steps or min(weights) < 0 or not any(weights):
    raise ValueError(f"loss.step_weights must be {max_steps} comma-separated weights >= 0, not "
                     f"all zero (e.g. \"4{',1' * (max_steps - 1)}\"), or \"\" for equal ones; "
                     f"got {spec!r}.")
  return weights


def hamburger_loss_from_stats(stats, stop_logits, target_lengths, stop_weight: float = 0.5,
                              stop_target: str = "segments", step_weights=None):
  """`hamburger_loss` from per-token {"ce", "correct"} [B, M, S] (see token_stats).

  step_weights (S floats or None): the label loss is the CE averaged with these weights per
  micro step (parse_step_weights); the metrics' label_loss / perplexity stay unweighted.
  """
  s = stop_logits.shape[-1]
  mask = target_masks(target_lengths, s)[0]
  stop_targets = stop_targets_from(target_lengths, stats["correct"], stop_target)
  bce = optax.sigmoid_binary_cross_entropy(stop_logits.astype(jnp.float32), stop_targets)
  label_loss = masked_mean(stats["ce"], mask)
  weighted = label_loss
  if step_weights is not None:
    w = jnp.asarray(step_weights, jnp.float32) * mask
    weighted = jnp.sum(stats["ce"] * w) / jnp.maximum(jnp.sum(w), 1e-9)
  stop_loss = masked_mean(bce, mask)
  loss = weighted + stop_weight * stop_loss
  metrics = {"label_loss": label_loss, "stop_loss": stop_loss,
             "perplexity": jnp.exp(label_loss)}
  metrics["loss"] = loss

  correct = stats["correct"]
  for j in range(s):
    metrics[f"accuracy_s{j + 1}"] = masked_mean(correct[..., j], mask[..., j])
  stop_pred = (stop_logits > 0).astype(jnp.float32)
  metrics["accuracy"] = masked_mean(correct, mask)
  metrics["stop_accuracy"] = masked_mean(stop_pred == stop_targets, mask)
  metrics["stop_target_rate"] = masked_mean(stop_targets, mask)
  num_groups = jnp.sum(target_lengths > 0)
  metrics["tokens"] = jnp.sum(mask).astype(jnp.float32)
  metrics["tokens_per_group"] = metrics["tokens"] / jnp.maximum(num_groups, 1)
  return loss, metrics


def base_lm_loss(base_cfg, params, batch, execution: Execution = Execution(), chunk: int = 0):
  """Next-token CE of the base model on size-1 groups -> (loss, metrics)."""
  model = LlamaModel(base_cfg, execution)
  variables = {"params": params["base"]}
  out = model.apply(variables, batch["group_tokens"][..., 0], positions=batch["positions"],
                    segment_ids=batch["segment_ids"], return_logits=False)
  targets, mask = batch["target_tokens"][..., 0], batch["target_lengths"] > 0
  stats = chunked_map(lambda h, t: stats_from_logits(vocab_constrained(
      model.apply(variables, h, method="logits")), t), (out.hidden, targets), chunk)
  loss = masked_mean(stats["ce"], mask)
  acc = masked_mean(stats["correct"], mask)
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


def teacher_hidden(base_cfg, teacher_params, batch, plain_len: int,
                   execution: Execution = Execution()):
  """The teacher's final hidden state before every target token -> ([B, M, S, D], valid)."""
  plain, slot, valid = plain_view(batch, plain_len)
  out = LlamaModel(base_cfg, execution).apply(
      {"params": teacher_params}, plain["tokens"], positions=plain["positions"],
      segment_ids=plain["segment_ids"], return_logits=False)
  b, m, s = slot.shape
  idx = jnp.minimum(slot, plain_len - 1).reshape(b, m * s)
  hidden = jnp.take_along_axis(out.hidden, idx[..., None], axis=1)
  return jax.lax.stop_gradient(hidden.reshape(b, m, s, -1)), valid


def teacher_logits(base_cfg, teacher_params, batch, plain_len: int):
  """The teacher's next-token logits for every target token -> ([B, M, S, V], valid [B, M, S])."""
  hidden, valid = teacher_hidden(base_cfg, teacher_params, batch, plain_len)
  logits = LlamaModel(base_cfg).apply({"params": teacher_params}, hidden, method="logits")
  return jax.lax.stop_gradient(logits), valid


def expected_tokens_per_step(stop_logits, target_lengths):
  """Mean over predicting positions of E[group size] = sum_j prod_{i<j} P(continue at i)."""
  cont = 1.0 - jax.nn.sigmoid(stop_logits.astype(jnp.float32))                   # [B, M, S]
  reach = jnp.cumprod(jnp.concatenate([jnp.ones_like(cont[..., :1]), cont[..., :-1]], -1), -1)
  return masked_mean(reach.sum(-1), target_lengths > 0)


def micro_stats(cfg: HamburgerConfig, execution: Execution, params, teacher_params, features,
                targets, t_hidden):
  """Micro decoder + heads on (a chunk of) positions -> {"ce", "correct", "stop"(, "kl")}."""
  model = HamburgerModel(cfg, execution)
  variables = {"params": params}
  micro = model.apply(variables, features, targets, method="micro_outputs")
  logits, stop = model.apply(variables, micro, method="heads")
  t_logits = None
  if t_hidden is not None:
    t_logits = vocab_constrained(LlamaModel(cfg.base).apply({"params": teacher_params}, t_hidden,
                                                            method="logits"))
  return {**stats_from_logits(vocab_constrained(logits), targets, t_logits), "stop": stop}


def hamburger_train_loss(cfg: HamburgerConfig, loss_cfg, plain_len, max_targets, execution,
                         params, batch, teacher):
  """HAMburger loss (+ kl_weight x KL to the teacher) -> (loss, metrics).

  max_targets (static, None = all): the micro decoder runs only on that many target positions
  per row (see HamburgerModel.__call__); positions past it are counted in `targets_dropped`.
  """
  _, features, targets, lengths = HamburgerModel(cfg, execution).apply(
      {"params": params}, batch, max_targets, method="base_features")
  t_params = t_hidden = None
  if loss_cfg.kl_weight:
    t_params = jax.lax.stop_gradient(params["base"] if teacher is None else teacher)
    t_hidden, valid = teacher_hidden(cfg.base, t_params, batch, plain_len, execution)
    if max_targets is not None:          # the same K positions as the student's features
      idx = gather_target_positions(batch, max_targets)
      t_hidden = jnp.take_along_axis(t_hidden, idx[:, :, None, None], axis=1)
      valid = jnp.take_along_axis(valid, idx[:, :, None], axis=1)
  # Chunks are rematerialised as a whole: no second, per-layer remat inside them.
  chunk = loss_cfg.chunk_size
  micro_ex = dataclasses.replace(execution, remat="none") if chunk else execution
  stats = chunked_map(functools.partial(micro_stats, cfg, micro_ex, params, t_params),
                      (features, targets, t_hidden), chunk)
  loss, metrics = hamburger_loss_from_stats(stats, stats["stop"], lengths,
                                            stop_weight=loss_cfg.stop_weight,
                                            stop_target=loss_cfg.get("stop_target", "segments"),
                                            step_weights=parse_step_weights(
                                                loss_cfg.get("step_weights", ""), cfg.max_steps))
  if max_targets is not None:
    metrics["targets_dropped"] = (jnp.sum(batch["target_lengths"] > 0)
                                  - jnp.sum(lengths > 0)).astype(jnp.float32)
  if loss_cfg.kl_weight:
    mask = target_masks(lengths, cfg.max_steps)[0] & valid
    metrics["kl"] = masked_mean(stats["kl"], mask)
    loss = loss + loss_cfg.kl_weight * metrics["kl"]
    metrics["loss"] = loss
  metrics["expected_tokens_per_step"] = expected_tokens_per_step(stats["stop"], lengths)
  return loss, metrics


def make_loss_fn(config, cfg: HamburgerConfig, execution: Execution = Execution()):
  """-> loss_fn(params, batch, teacher) -> (scalar loss, metrics dict) for `config.mode`."""
  if config.mode == "base_lm":
    return lambda params, batch, teacher: base_lm_loss(cfg.base, params, batch, execution,
                                                       config.loss.chunk_size)
  plain_len = config.loss.teacher_len or config.data.seq_len * cfg.max_steps
  max_targets = config.model.max_targets or None
  return functools.partial(hamburger_train_loss, cfg, config.loss, plain_len, max_targets,
                           execution)
