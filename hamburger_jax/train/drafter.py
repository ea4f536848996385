"""Training the micro decoder and stop head for verified decoding, on cached base features.

The base never runs here: `drafter_features` cached its features over unmerged answers once. Only
params["micro_decoder"] (its layers and the stop head) train; the token embedding / LM head stay
the base's. For a cached position t (input x_t, features h_t [F, D]) the micro decoder is teacher
forced with x_{t+1} .. x_{t+S-1}; its step j >= 1 drafts the base's greedy token g_{t+j} (the
acceptance target), its stop head at step j predicts that draft j + 1 is rejected:

    loss = CE(draft logits over the draft vocabulary, g_{t+j})          j = 1 .. S-1, valid rows
         + stop_weight * BCE(stop logit at j, draft j+1 rejected)       j = 0 .. S-2

With soft_weight w > 0 the CE term is (1 - w) CE(.., g_{t+j}) + w CE(.., p_{t+j}): p_{t+j} is the
base's own next-token distribution over the draft vocabulary, from the cached final-norm features
of position t+j (its argmax is g_{t+j}), so the drafter also learns how sure the base is.

A step is valid while the fed tokens are the base's own greedy path (x_{t+i+1} == g_{t+i}, i < j)
and its target is in the draft vocabulary (drafts choose only from it).

    metrics = acceptance(cfg, params, draft_ids, cache)   # per draft index, teacher forced
    params, log = train(cfg, params, draft_ids, train_cache, steps=..., batch=...)

Teacher forcing averages over every position; verified decoding visits only the positions after
each forward's last committed token, and those are harder (a rejection leaves the drafter at a
token it did not expect). `acceptance` therefore also walks each answer as greedy verified
decoding would (`decode_walk`): its tokens per forward are what the decode loop gets on the same
answers, not the teacher-forced average.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hamburger_jax.model.hamburger import HamburgerModel
from hamburger_jax.model.quantize import head_rows


def valid_steps(teacher: np.ndarray, greedy: np.ndarray, draft_ids: np.ndarray) -> np.ndarray:
  """[N, S] bool: step j's draft target g_{t+j} is on the base's greedy path and draftable."""
  on_path = np.cumprod(teacher[:, :-1] == greedy[:, :-1], axis=1).astype(bool)   # i < j, j>=1
  member = np.zeros(int(max(greedy.max(), draft_ids.max())) + 2, bool)
  member[draft_ids] = True
  draftable = member[np.maximum(greedy[:, 1:], 0)] & (greedy[:, 1:] >= 0)
  valid = np.zeros(greedy.shape, bool)
  valid[:, 1:] = on_path & draftable
  return valid


def _index_in_draft(greedy: np.ndarray, draft_ids: np.ndarray, vocab_size: int) -> np.ndarray:
  """[N, S] the target's index among the draft ids (0 where it is not one)."""
  where = np.zeros(vocab_size, np.int32)
  where[draft_ids] = np.arange(draft_ids.size, dtype=np.int32)
  return where[np.clip(greedy, 0, vocab_size - 1)]


def _frozen(params):
  """What the drafter reads (token embedding, LM head if untied, micro decoder) as device arrays:
  jit arguments, never constants folded into the program."""
  base = {k: jax.device_put(params["base"][k]) for k in ("embed_tokens", "lm_head")
          if k in params["base"]}
  return {"base": base, "micro_decoder": jax.device_put(params["micro_decoder"])}


def _outputs(cfg, params, micro, draft_ids, features, teacher):
  """-> (draft logits [N, S, K] f32, stop logits [N, S] f32) with micro-decoder params `micro`."""
  full = {**params, "micro_decoder": micro}
  model = HamburgerModel(cfg)
  out = model.apply({"params": full}, features[:, None].astype(cfg.base.jnp_dtype),
                    teacher[:, None], method=HamburgerModel.micro_outputs)[:, 0]   # [N, S, D]
  stop = model.apply({"params": full}, out, method=HamburgerModel.stop)
  return _draft_logits(cfg, params, draft_ids, out), stop


def _draft_logits(cfg, params, draft_ids, hidden):
  """hidden [..., D] -> logits over the draft vocabulary [..., K] f32 (the LM head's K rows)."""
  table = head_rows(params["base"], draft_ids, cfg.base.tie_word_embeddings, jnp.float32)
  return hidden.astype(jnp.float32) @ table.T


def _loss(cfg, params, micro, draft_ids, batch, stop_weight, soft_weight=0.0):
  logits, stop = _outputs(cfg, params, micro, draft_ids, batch["features"], batch["teacher"])
  valid = batch["valid"][:, 1:]
  target = batch["target_index"][:, 1:]
  ce = optax.softmax_cross_entropy_with_integer_labels(logits[:, 1:], target)
  if soft_weight:        # the base's distributions at t+1 .. t+S-1: batch["base_final"] [N, S-1, D]
    base = jax.nn.softmax(_draft_logits(cfg, params, draft_ids, batch["base_final"]), axis=-1)
    ce = (1 - soft_weight) * ce + soft_weight * optax.softmax_cross_entropy(logits[:, 1:], base)
  ce = jnp.sum(ce * valid) / jnp.maximum(jnp.sum(valid), 1)
  accepted = jax.lax.stop_gradient(jnp.argmax(logits[:, 1:], -1) == target) & valid
  rejected = (~accepted).astype(jnp.float32)
  bce = optax.sigmoid_binary_cross_entropy(stop[:, :-1], rejected)
  bce = jnp.sum(bce * valid) / jnp.maximum(jnp.sum(valid), 1)
  return ce + stop_weight * bce, (ce, bce, accepted, valid)


ROW_KEYS = ("features", "teacher", "valid", "target_index")     # per cached position


def prepare(cache: dict, draft_ids: np.ndarray, vocab_size: int) -> dict:
  """The cache -> the arrays a batch is cut from (ROW_KEYS), and answer_rows [A] (positions per
  answer, in order) when the cache has them."""
  data = {"features": cache["features"], "teacher": cache["teacher"],
          "valid": valid_steps(cache["teacher"], cache["greedy"], draft_ids),
          "target_index": _index_in_draft(cache["greedy"], draft_ids, vocab_size)}
  if "answer_rows" in cache:
    data["answer_rows"] = cache["answer_rows"]
  return data


def _following_final_features(features: np.ndarray, pick: np.ndarray, s: int) -> np.ndarray:
  """features [N, F, D], rows pick [B] -> the final-norm features of rows pick + 1 .. pick + S - 1
  [B, S-1, D] (clipped at the last row; a valid step's row t+j is its answer's position t+j)."""
  follow = np.minimum(pick[:, None] + np.arange(1, s), len(features) - 1)
  return features[follow, -1]


def walk_rows(prefix: np.ndarray, answer_rows: np.ndarray) -> np.ndarray:
  """[N] bool: the positions greedy verified decoding drafts from, walking cached answers.

  prefix [N]: at each position, how many of its drafts the base accepts (teacher forced);
  answer_rows [A]: positions per answer (row r of an answer drafts after its token r). The first
  forward (the prompt's) commits token 0 and drafts from row 0; a forward verifying row r's drafts
  commits prefix[r] of them and the base's next token, and the next drafts come from the row of
  that token, so the walk visits only those rows.
  """
  visited = np.zeros(len(prefix), bool)
  start = 0
  for n in np.asarray(answer_rows).tolist():
    r = 0
    while r + 1 < n:
      visited[start + r] = True
      r += min(int(prefix[start + r]), n - 2 - r) + 1
    start += n
  return visited


def decode_walk(prefix: np.ndarray, answer_rows: np.ndarray) -> float:
  """Tokens per forward of greedy verified decoding over cached answers (`walk_rows`): each
  answer takes the prompt's forward plus one per visited row."""
  forwards = len(answer_rows) + int(np.sum(walk_rows(prefix, answer_rows)))
  return float(np.sum(answer_rows) / max(forwards, 1))


def accepted_drafts(cfg, params, draft_ids, data: dict, batch: int = 512) -> np.ndarray:
  """[N, S-1] bool, teacher forced on `data` (from `prepare`): draft j of each position is the
  base's token and every draft before it was."""
  fn = jax.jit(lambda p, ids, f, t: _outputs(cfg, p, p["micro_decoder"], ids, f, t))
  params, ids = _frozen(params), jnp.asarray(draft_ids)
  hits = []
  for a in range(0, len(data["teacher"]), batch):
    logits, _ = fn(params, ids, jnp.asarray(data["features"][a:a + batch]),
                   jnp.asarray(data["teacher"][a:a + batch]))
    ok = (np.asarray(jnp.argmax(logits, -1)) == data["target_index"][a:a + batch])
    hits.append(ok & data["valid"][a:a + batch])
  return np.cumprod(np.concatenate(hits)[:, 1:], axis=1).astype(bool)


def acceptance(cfg, params, draft_ids, data: dict, batch: int = 512) -> dict:
  """Teacher-forced acceptance on `data` (from `prepare`): per draft index j, the fraction of
  drafts the base accepts given every earlier one was, and the tokens per forward with S - 1
  drafts always proposed (1 + expected accepted prefix, over the positions whose drafts all lie
  inside the answer; "every_position": over all of them, drafts past the end rejected); with
  answer_rows, also the tokens per forward of decoding the answers (`decode_walk`)."""
  s = cfg.max_steps
  prefix = accepted_drafts(cfg, params, draft_ids, data, batch)
  reached = np.concatenate([np.ones((len(prefix), 1), bool), prefix[:, :-1]], axis=1)
  # A row counts where every step up to the last it reaches is valid (targets exist).
  rows = data["valid"][:, 1:].all(axis=1)
  conditional = [float(np.sum(prefix[rows, j]) / max(np.sum(reached[rows, j]), 1))
                 for j in range(s - 1)]
  out = {"positions": int(np.sum(rows)), "conditional_acceptance": conditional,
         "tokens_per_forward": float(1.0 + np.mean(np.sum(prefix[rows], axis=1))),
         "every_position": float(1.0 + np.mean(np.sum(prefix, axis=1)))}
  if "answer_rows" in data:
    out["decoded_tokens_per_forward"] = decode_walk(np.sum(prefix, axis=1), data["answer_rows"])
  return out


def walk_weighted_rows(cfg, params, draft_ids, data: dict, weight: int) -> np.ndarray:
  """Row indices for `train(rows=...)`: every position with a valid first draft, those that
  decoding visits with these params (`walk_rows`) `weight` times, so that training sees the
  positions decoding drafts from as often as it meets them, harder than the average."""
  rows = np.flatnonzero(data["valid"][:, 1])
  prefix = np.sum(accepted_drafts(cfg, params, draft_ids, data), axis=1)
  visited = np.flatnonzero(walk_rows(prefix, data["answer_rows"]) & data["valid"][:, 1])
  return np.concatenate([rows] + [visited] * (weight - 1))


def train(cfg, params, draft_ids, data: dict, *, steps: int, batch: int = 256, lr: float = 3e-4,
          stop_weight: float = 0.5, soft_weight: float = 0.0, stop_head_only: bool = False,
          seed: int = 0, rows: np.ndarray | None = None, log_every: int = 50, log=print):
  """Adam(W) with cosine decay on params["micro_decoder"] only -> (params, history rows).

  stop_head_only: the drafts stay as they are and only the stop head learns, from their
  acceptance on `data` (answers the drafter never trained on, so the stop head learns the
  acceptance it will meet, not its training fit). rows: the row indices batches are drawn from
  (a repeated index is drawn more often; default: every position with a valid first draft).
  soft_weight: the share of the base's own distributions in the draft targets (module docstring;
  rows t+1 .. t+S-1 of `data` must be the same answer's next positions where a step is valid)."""
  opt = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, lr, min(100, steps // 10 + 1), steps,
                                                       lr * 0.1), weight_decay=0.0)
  frozen = _frozen(params)
  micro = frozen["micro_decoder"]
  state = opt.init(micro)
  ids = jnp.asarray(draft_ids)

  def loss_fn(m, frozen, b):
    if stop_head_only:
      m = {k: v if k == "stop_head" else jax.lax.stop_gradient(v) for k, v in m.items()}
    return _loss(cfg, frozen, m, ids, b, stop_weight, soft_weight)

  @jax.jit
  def step(frozen, micro, state, b):
    (loss, (ce, bce, acc, valid)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        micro, frozen, b)
    updates, state = opt.update(grads, state, micro)
    rate = jnp.sum(acc) / jnp.maximum(jnp.sum(valid), 1)
    return optax.apply_updates(micro, updates), state, {"loss": loss, "ce": ce, "bce": bce,
                                                        "draft_accuracy": rate}

  rng = np.random.default_rng(seed)
  rows = np.flatnonzero(data["valid"][:, 1]) if rows is None else rows
  history, t0 = [], time.time()
  for i in range(1, steps + 1):
    pick = rng.choice(rows, size=batch, replace=False)
    b = {k: jnp.asarray(data[k][pick]) for k in ROW_KEYS}
    if soft_weight:
      b["base_final"] = jnp.asarray(_following_final_features(data["features"], pick, cfg.max_steps))
    micro, state, m = step(frozen, micro, state, b)
    if i % log_every == 0 or i == steps:
      row = {"step": i, **{k: float(v) for k, v in m.items()}, "seconds": time.time() - t0}
      history.append(row)
      log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
  return {**params, "micro_decoder": jax.device_get(micro)}, history
