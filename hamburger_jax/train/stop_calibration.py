"""Refit the stop head alone, to the trust gate or to the training targets, at equal budget.

At decode time a group goes on past token j when the stop head's continue-probability at j is
>= the confidence; the draft of token j + 1 then joins the group only if the micro decoder's own
probability of it is >= `min_token_prob` (the trust gate). A draft the gate drops has cost a
micro step for nothing. Trained on the segmentation (and "correct"), the stop head learns where
the base is confident, not where the next draft will pass the gate, so at the shipped defaults
about half the drafts it asks for are dropped.

This module refits the stop head alone (everything else frozen) to one of four labels
(y_j = 1: continue after token j), on the same frozen forward, so they compare at equal budget:

  "gate": the draft of token j + 1 is kept (prob >= min_token_prob) AND equals the answer's
    token, on teacher-forced micro outputs whose targets run past the segmentation's group end
    (the next S answer tokens: at decode time a group may go on where the segmentation ended
    it); a sample (n, j) counts only where the decode path reaches it with the teacher's
    context: the drafts of tokens 1..j were kept and right.
  "segments": j is not the last token of its segmentation group (the training loss's
    `loss.stop_target="segments"`), inside the group.
  "correct": as "segments", and the micro decoder's teacher-forced prediction of token j + 1 is
    right (`loss.stop_target="correct"`), inside the group.
  "readable": as "correct", and the base reads the merged group right: micro step 0 at the
    next macro position (the base's own next token after reading this group as one input)
    equals the answer's token. Groups of one token are never merged, so only groups of >= 2
    tokens can lose their labels; the example's last group counts as read.

    outcomes = collect(cfg, params, examples)                  # one frozen forward
    y, valid = labels(outcomes, min_token_prob=0.8)            # target="gate"
    head, report = fit(cfg, stop_head_params, outcomes.hidden, y, valid, val_mask)
    simulate(stop_logits, outcomes, confidence=0.35, min_token_prob=0.8)  # offline decode counts

Shapes: N = macro positions with a target, S = max_steps, D = hidden size.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hamburger_jax.model.batch import example_to_macro
from hamburger_jax.model.config import HamburgerConfig
from hamburger_jax.model.hamburger import HamburgerModel
from hamburger_jax.model.micro_decoder import StopHead


class DraftOutcomes(NamedTuple):
  """Teacher-forced micro outputs at every target position, on extended targets."""
  hidden: np.ndarray      # [N, S, D] float32: the micro outputs (what the heads read)
  stop: np.ndarray        # [N, S] float32: the current stop head's logits
  token: np.ndarray       # [N, S] int32: the greedy draft of each micro step
  prob: np.ndarray        # [N, S] float32: the model's probability of that draft
  target: np.ndarray      # [N, S] int32: the next S answer tokens (zero past the answer)
  target_len: np.ndarray  # [N] int32: how many of them exist (1..S)
  example: np.ndarray     # [N] int32: index of the example the position belongs to
  group_len: np.ndarray   # [N] int32: the segmentation's size of the group predicted (1..S)


def extended_targets(prompt_len: int, response: Sequence[int], steps: Sequence[int],
                     max_steps: int) -> tuple[np.ndarray, np.ndarray]:
  """-> targets [M, S], lengths [M] over the example's M macro positions: at the position that
  predicts group g (the last prompt token for g = 0, else group g - 1's input), the S answer
  tokens from group g's first token on, past its end; zero where a position predicts nothing."""
  response = np.asarray(response, np.int32)
  m = prompt_len + len(steps) - 1
  targets = np.zeros((m, max_steps), np.int32)
  lengths = np.zeros((m,), np.int32)
  starts = np.concatenate([[0], np.cumsum(steps)[:-1]]).astype(np.int64)
  for g, a in enumerate(starts):
    tail = response[a:a + max_steps]
    targets[prompt_len - 1 + g, :len(tail)] = tail
    lengths[prompt_len - 1 + g] = len(tail)
  return targets, lengths


@functools.lru_cache(maxsize=4)
def _forward(cfg: HamburgerConfig):
  model = HamburgerModel(cfg)

  @jax.jit
  def run(params, batch, targets):
    variables = {"params": params}
    _, features, _, _ = model.apply(variables, batch, None, method="base_features")
    micro = model.apply(variables, features, targets, method="micro_outputs")   # [B, M, S, D]
    logits, stop = model.apply(variables, micro, method="heads")
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    prob = jnp.exp(jnp.max(logp, axis=-1))
    return micro.astype(jnp.float32), stop, token, prob

  return run


def collect(cfg: HamburgerConfig, params, examples: Sequence[tuple], rows: int = 8,
            bucket: int = 64) -> DraftOutcomes:
  """examples: (prompt ids, response ids, group sizes) -> DraftOutcomes of every position that
  predicts a group. One example per row, M padded to a multiple of `bucket` (one compile each)."""
  s = cfg.max_steps
  run = _forward(cfg)
  fields = ("group_tokens", "group_lengths", "positions", "segment_ids", "target_tokens",
            "target_lengths")
  parts = {k: [] for k in DraftOutcomes._fields}
  order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]) + len(examples[i][2]))
  for b0 in range(0, len(order), rows):
    idx = order[b0:b0 + rows]
    macros = [example_to_macro(*examples[i], s) for i in idx]
    m = -(-max(len(x["group_lengths"]) for x in macros) // bucket) * bucket
    batch = {k: np.zeros((rows, m) + ((s,) if k.endswith("tokens") else ()), np.int32)
             for k in fields}
    targets = np.zeros((rows, m, s), np.int32)
    lengths = np.zeros((rows, m), np.int32)
    for r, (i, macro) in enumerate(zip(idx, macros)):
      n = len(macro["group_lengths"])
      for k, v in macro.items():
        batch[k][r, :n] = v
      batch["segment_ids"][r, :n] = 1
      prompt, response, steps = examples[i]
      targets[r, :n], lengths[r, :n] = extended_targets(len(prompt), response, steps, s)
    hidden, stop, token, prob = jax.device_get(run(params, batch, targets))
    for r, i in enumerate(idx):
      sel = lengths[r] > 0
      for name, value in zip(DraftOutcomes._fields,
                             (hidden[r], stop[r], token[r], prob[r], targets[r], lengths[r])):
        parts[name].append(np.asarray(value)[sel])
      parts["example"].append(np.full(int(sel.sum()), i, np.int32))
      parts["group_len"].append(batch["target_lengths"][r][sel])
  return DraftOutcomes(*(np.concatenate(parts[k]) for k in DraftOutcomes._fields))


TARGETS = ("gate", "segments", "correct", "readable")


def labels(outcomes: DraftOutcomes, min_token_prob: float,
           target: str = "gate") -> tuple[np.ndarray, np.ndarray]:
  """-> y [N, S] (1 = continue after token j), valid [N, S]; `target` in TARGETS (see above)."""
  if target not in TARGETS:
    raise ValueError(f"Unknown stop target {target!r}: use one of {', '.join(TARGETS)}.")
  n, s = outcomes.token.shape
  j = np.arange(s)[None]
  if target != "gate":
    inside = j < outcomes.group_len[:, None]
    y = j < outcomes.group_len[:, None] - 1
    if target in ("correct", "readable"):
      right = outcomes.token == outcomes.target
      y = y & np.pad(right[:, 1:], ((0, 0), (0, 1)))
    if target == "readable":
      y = y & merge_read_right(outcomes)[:, None]
    return y.astype(np.float32), inside
  exists = j < outcomes.target_len[:, None]
  good = (outcomes.token == outcomes.target) & exists & (outcomes.prob >= min_token_prob)
  reach = np.ones((n, s), bool)          # reach[j]: the drafts of tokens 1..j kept and right
  for j in range(1, s):
    reach[:, j] = reach[:, j - 1] & good[:, j]
  y = np.zeros((n, s), np.float32)
  valid = np.zeros((n, s), bool)
  y[:, :-1] = good[:, 1:]
  valid[:, :-1] = reach[:, :-1] & exists[:, 1:]
  return y, valid


def merge_read_right(outcomes: DraftOutcomes) -> np.ndarray:
  """-> [N] bool: after position n's group is read as one input, micro step 0 at the next
  position of the same example (positions come in order per example) predicts the answer's next
  token; True where the example has no next position."""
  step0_right = outcomes.token[:, 0] == outcomes.target[:, 0]
  same = np.zeros(len(step0_right), bool)
  same[:-1] = outcomes.example[1:] == outcomes.example[:-1]
  nxt = np.ones(len(step0_right), bool)
  nxt[:-1] = step0_right[1:]
  return nxt | ~same


class FitReport(NamedTuple):
  val_bce_before: float
  val_bce_after: float
  best_step: int
  train_samples: int
  val_samples: int


def fit(cfg: HamburgerConfig, stop_params, hidden, y, valid, val_mask, steps: int = 3000,
        learning_rate: float = 3e-4, batch_size: int = 1024, eval_every: int = 100,
        seed: int = 0) -> tuple[dict, FitReport]:
  """Refits the stop head (params of `StopHead`, float32) by BCE on the stop target 1 - y.

  hidden [N, S, D], y / valid [N, S], val_mask [N] (positions held out for early stopping: the
  returned params are those with the lowest validation BCE, evaluated every `eval_every` steps).
  """
  head = StopHead(cfg)
  train_sel, val_sel = valid & ~val_mask[:, None], valid & val_mask[:, None]
  x, t = jnp.asarray(hidden[train_sel]), jnp.asarray(1.0 - y[train_sel])
  xv, tv = jnp.asarray(hidden[val_sel]), jnp.asarray(1.0 - y[val_sel])
  if len(x) == 0 or len(xv) == 0:
    raise ValueError(f"Stop-head refit needs training and validation samples; got {len(x)} and "
                     f"{len(xv)}: give more examples.")
  tx = optax.adamw(optax.cosine_decay_schedule(learning_rate, steps, 0.05), weight_decay=1e-2)
  params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), stop_params)

  def bce(p, xs, ts):
    return optax.sigmoid_binary_cross_entropy(head.apply({"params": p}, xs), ts).mean()

  @jax.jit
  def step(p, opt, key):
    i = jax.random.randint(key, (batch_size,), 0, x.shape[0])
    grads = jax.grad(bce)(p, x[i], t[i])
    updates, opt = tx.update(grads, opt, p)
    return optax.apply_updates(p, updates), opt

  val_bce = jax.jit(bce)
  before = float(val_bce(params, xv, tv))
  best, best_params, best_step = before, params, 0
  opt, key = tx.init(params), jax.random.PRNGKey(seed)
  for it in range(1, steps + 1):
    key, sub = jax.random.split(key)
    params, opt = step(params, opt, sub)
    if it % eval_every == 0:
      v = float(val_bce(params, xv, tv))
      if v < best:
        best, best_params, best_step = v, params, it
  return best_params, FitReport(before, best, best_step, int(len(x)), int(len(xv)))


def stop_logits(cfg: HamburgerConfig, stop_params, hidden) -> np.ndarray:
  """hidden [..., D] -> stop logits [...] of `stop_params`."""
  return np.asarray(jax.jit(StopHead(cfg).apply)({"params": stop_params}, jnp.asarray(hidden)))


def simulate(stop: np.ndarray, outcomes: DraftOutcomes, confidence: float,
             min_token_prob: float) -> dict:
  """The decode rule on teacher-forced outcomes: per macro position, mean tokens emitted, micro
  steps run (each costs one draft) and kept drafts that differ from the answer's token."""
  n, s = stop.shape
  go_prob = 1.0 / (1.0 + np.exp(stop.astype(np.float64)))        # 1 - sigmoid(stop logit)
  tokens, micro, wrong = np.ones(n), np.zeros(n), np.zeros(n)
  alive = np.ones(n, bool)
  for j in range(s - 1):
    go = alive & (go_prob[:, j] >= confidence) & (outcomes.target_len > j + 1)
    keep = go & (outcomes.prob[:, j + 1] >= min_token_prob)
    micro += go
    tokens += keep
    wrong += keep & (outcomes.token[:, j + 1] != outcomes.target[:, j + 1])
    alive = keep
  return {"tokens_per_step": float(tokens.mean()), "micro_steps_per_step": float(micro.mean()),
          "wrong_drafts_per_step": float(wrong.mean()),
          "kept_per_micro_step": float((tokens.mean() - 1) / max(micro.mean(), 1e-9))}
