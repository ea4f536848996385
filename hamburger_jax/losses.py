"""The HAMburger training loss: masked cross-entropy + stop_weight x stop BCE (+ optional KL).

All inputs are per macro position and micro step: logits [B, M, S, V], stop logits [B, M, S],
target tokens [B, M, S] and target lengths [B, M] (0 = no target). Means are over real tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def target_masks(target_lengths, max_steps: int):
  """-> (token mask [B, M, S]: j < length, stop targets [B, M, S]: j == length - 1)."""
  j = jnp.arange(max_steps)
  lengths = target_lengths[..., None]
  return j < lengths, (j == lengths - 1).astype(jnp.float32)


def masked_mean(x, mask):
  mask = mask.astype(jnp.float32)
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def kl_to_teacher(student_logits, teacher_logits):
  """KL(teacher || student) per position, [...]."""
  t_logp = jax.nn.log_softmax(teacher_logits.astype(jnp.float32), -1)
  s_logp = jax.nn.log_softmax(student_logits.astype(jnp.float32), -1)
  return jnp.sum(jnp.exp(t_logp) * (t_logp - s_logp), -1)


def hamburger_loss(logits, stop_logits, target_tokens, target_lengths, stop_weight: float = 0.5,
                   teacher_logits=None, kl_weight: float = 0.0):
  """-> (loss scalar, metrics dict of on-device scalars).

  teacher_logits [B, M, S, V] (optional): the frozen base model's distribution for each target
  token; adds kl_weight x mean KL(teacher || student).
  """
  s = logits.shape[-2]
  mask, stop_targets = target_masks(target_lengths, s)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), target_tokens)
  bce = optax.sigmoid_binary_cross_entropy(stop_logits.astype(jnp.float32), stop_targets)
  label_loss = masked_mean(ce, mask)
  stop_loss = masked_mean(bce, mask)
  loss = label_loss + stop_weight * stop_loss
  metrics = {"label_loss": label_loss, "stop_loss": stop_loss,
             "perplexity": jnp.exp(label_loss)}
  if teacher_logits is not None and kl_weight:
    kl = masked_mean(kl_to_teacher(logits, teacher_logits), mask)
    loss = loss + kl_weight * kl
    metrics["kl"] = kl
  metrics["loss"] = loss

  correct = (jnp.argmax(logits, -1) == target_tokens) & mask
  for j in range(s):
    metrics[f"accuracy_s{j + 1}"] = masked_mean(correct[..., j], mask[..., j])
  stop_pred = (stop_logits > 0).astype(jnp.float32)
  metrics["accuracy"] = masked_mean(correct, mask)
  metrics["stop_accuracy"] = masked_mean(stop_pred == stop_targets, mask)
  num_groups = jnp.sum(target_lengths > 0)
  metrics["tokens"] = jnp.sum(mask).astype(jnp.float32)
  metrics["tokens_per_group"] = metrics["tokens"] / jnp.maximum(num_groups, 1)
  return loss, metrics
