"""How likely each draft is accepted, from its own probability: the width rule's calibration.

Verified decoding's width rule (`decode/draft_width.py`) weighs each draft by an estimate that the
base accepts it. The micro decoder's probability q_j of its draft j ranks drafts well but is
overconfident, so it is mapped per draft index to

    estimate_j = sigmoid(slope_j * logit(q_j) + intercept_j)

fit by logistic regression (Newton's method) on cached base features (`drafter_features`) of
answers the drafter never trained on, at the positions greedy verified decoding drafts from
(`drafter.walk_rows`) and only where drafts 1..j-1 were accepted. q_j is normalised as decoding
normalises it (over the draft vocabulary plus its sample of the other tokens,
`DecodeModel.draft_heads`).

    q = draft_probabilities(cfg, params, draft_ids, rest, data)  # [N, S]
    pairs, report = fit(q, accepted, data["answer_rows"])        # accepted: drafter.accepted_drafts
"""

from __future__ import annotations

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.model.hamburger import HamburgerModel
from hamburger_jax.model.quantize import head_rows
from hamburger_jax.train.drafter import walk_rows

FORMAT = "hamburger_jax.verify_calibration"


def draft_probabilities(cfg, params, draft_ids, rest, data: dict, batch: int = 512) -> np.ndarray:
  """[N, S] f32: teacher forced on `data` (`drafter.prepare`), the micro decoder's probability of
  its greedy draft at each step (column j: draft j; column 0 unused). rest: (token ids, weight),
  decoding's sample of the tokens outside draft_ids (`decode.draft_vocab.rest_sample`)."""
  model = HamburgerModel(cfg)
  rest, weight = rest
  tie = cfg.base.tie_word_embeddings

  @jax.jit
  def probs(p, features, teacher):
    out = model.apply({"params": p}, features[:, None].astype(cfg.base.jnp_dtype),
                      teacher[:, None], method=HamburgerModel.micro_outputs)[:, 0]
    hidden = out.astype(jnp.float32)
    logits = hidden @ head_rows(p["base"], jnp.asarray(draft_ids), tie, jnp.float32).T
    others = hidden @ head_rows(p["base"], jnp.asarray(rest), tie, jnp.float32).T
    norm = jax.nn.logsumexp(jnp.concatenate([logits, others + jnp.log(weight)], -1), -1)
    return jnp.exp(jnp.max(logits, -1) - norm)

  return np.concatenate([
      np.asarray(probs(params, jnp.asarray(data["features"][a:a + batch]),
                       jnp.asarray(data["teacher"][a:a + batch])))
      for a in range(0, len(data["teacher"]), batch)])


def _logit(q):
  q = np.clip(q.astype(np.float64), 1e-6, 1 - 1e-6)
  return np.log(q) - np.log1p(-q)


def _logistic(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
  """(slope, intercept) maximising the likelihood of y [n] bool under sigmoid(slope x + b)."""
  design = np.stack([x, np.ones_like(x)], 1)
  w = np.zeros(2)
  for _ in range(100):
    p = 1 / (1 + np.exp(-design @ w))
    hess = design.T @ (design * (p * (1 - p) + 1e-9)[:, None]) + 1e-6 * np.eye(2)
    step = np.linalg.solve(hess, design.T @ (y - p))
    w += step
    if np.max(np.abs(step)) < 1e-8:
      break
  return float(w[0]), float(w[1])


def _auc(score: np.ndarray, y: np.ndarray) -> float | None:
  pos, neg = int(y.sum()), int((~y).sum())
  if not pos or not neg:
    return None
  ranks = np.empty(len(score))
  ranks[np.argsort(score, kind="stable")] = np.arange(1, len(score) + 1)
  return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


def reached(accepted: np.ndarray, answer_rows) -> list[np.ndarray]:
  """Per draft index j = 1..S-1, the positions [N] bool where decoding drafts and draft j is
  reached (every earlier draft accepted); accepted [N, S-1] from `drafter.accepted_drafts`."""
  visited = walk_rows(np.sum(accepted, axis=1), answer_rows)
  return [visited & (accepted[:, j - 2] if j > 1 else True) for j in range(1, accepted.shape[1] + 1)]


def estimate(q: np.ndarray, pairs) -> np.ndarray:
  """[N, S]: the calibrated estimate of each draft (column 0: 1)."""
  out = np.ones_like(q, dtype=np.float64)
  for j in range(1, q.shape[1]):
    slope, intercept = pairs[min(j, len(pairs)) - 1]
    out[:, j] = 1 / (1 + np.exp(-(slope * _logit(q[:, j]) + intercept)))
  return out


def report(q: np.ndarray, accepted: np.ndarray, answer_rows, pairs) -> list[dict]:
  """Per draft index: positions, acceptance, mean estimate, and how well q ranks acceptance."""
  est = estimate(q, pairs)
  rows = []
  for j, m in enumerate(reached(accepted, answer_rows), start=1):
    y = accepted[m, j - 1]
    rows.append({"draft": j, "positions": int(m.sum()), "acceptance": float(y.mean()),
                 "mean_estimate": float(est[m, j].mean()), "auc": _auc(q[m, j], y)})
  return rows


def fit(q: np.ndarray, accepted: np.ndarray, answer_rows) -> list[tuple[float, float]]:
  """(slope, intercept) per draft index j = 1..S-1 (see the module docstring)."""
  pairs = []
  for j, m in enumerate(reached(accepted, answer_rows), start=1):
    if m.sum() < 2 or accepted[m, j - 1].all() or not accepted[m, j - 1].any():
      raise ValueError(f"draft {j}: {int(m.sum())} positions reached, not both outcomes: "
                       "calibrate on more answers.")
    pairs.append(_logistic(_logit(q[m, j]), accepted[m, j - 1].astype(np.float64)))
  return pairs


def write(path: str, pairs, drafter_path: str, how: dict) -> None:
  """The calibration file beside the drafter (`decode.checkpoint.verify_calibration` reads it),
  bound to that drafter file by its sha256."""
  with open(drafter_path, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  record = {"format": FORMAT, "drafter_sha256": digest,
            "slope_intercept": [[round(a, 6), round(b, 6)] for a, b in pairs], "how": how}
  with open(path, "w", encoding="utf-8") as f:
    json.dump(record, f, indent=2)
    f.write("\n")
