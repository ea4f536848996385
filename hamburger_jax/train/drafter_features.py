"""The frozen base's features over unmerged answers, computed once and cached for drafter training.

Verified decoding (spec §9) feeds the base one token per input, so the micro decoder drafts from
the features of an UNMERGED context. For every answer position t (the last prompt token up to the
answer's second-to-last token) the cache holds:

    features [N, F, D] float16  the base's features at input x_t (feature_layers + final norm)
    teacher  [N, S]    int32    x_{t+1} .. x_{t+S}: the tokens that follow (0 past the end)
    greedy   [N, S]    int32    g_t .. g_{t+S-1}: the base's argmax after inputs x_t .. x_{t+S-1}
                                (-1 past the end)

Micro step j >= 1 (teacher-forced with x_{t+1} .. x_{t+j}) drafts a token the base accepts iff it
equals g_{t+j}; that target is meaningful while the fed tokens are the base's own greedy tokens
(x_{t+i+1} == g_{t+i} for every i < j), which `drafter.valid_steps` checks.
"""

from __future__ import annotations

import gzip
import json
import os
from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.model.hamburger import HamburgerModel

ROWS_TOKENS = 4096        # tokens per forward batch (rows x bucketed length)
LENGTH_BUCKET = 64


def read_answers(path: str, lines: tuple[int, int]) -> list[dict]:
  """Records `lines` = (first, end) (0-based, end exclusive) of a distilled .jsonl(.gz) file."""
  opener = gzip.open if path.endswith(".gz") else open
  out = []
  with opener(path, "rt", encoding="utf-8") as f:
    for i, line in enumerate(f):
      if i >= lines[1]:
        break
      if i >= lines[0] and line.strip():
        out.append(json.loads(line))
  return out


def tokenize_answers(records: Iterable[dict], tokenizer_path: str, system: str | None,
                     max_length: int = 1024) -> list[tuple[list[int], list[int]]]:
  """Records {"prompt", "response", "finish"} -> (prompt ids, response ids) in ChatML; a response
  cut by the length limit ("finish": "length") gets no end token. Longer pairs are cut."""
  from hamburger_jax.data.tokenize import ChatTokenizer, TokenizeConfig
  tok = ChatTokenizer(TokenizeConfig(tokenizer_path, template="chatml", system_prompt=system))
  pairs = []
  for r in records:
    prompt, response = tok.encode_prompt(r["prompt"]), tok.encode_response(r["response"])
    if r.get("finish") == "length" and response:
      response = response[:-1]
    response = response[:max(0, max_length - len(prompt))]
    if len(response) >= 2:
      pairs.append((prompt, response))
  return pairs


def _forward_fn(cfg):
  model = HamburgerModel(cfg)

  @jax.jit
  def forward(params, tokens):
    """tokens [B, T] -> (features [B, T, F, D] f16, greedy [B, T] i32)."""
    b, t = tokens.shape
    groups = jnp.zeros((b, t, cfg.max_steps), jnp.int32).at[..., 0].set(tokens)
    out = model.apply({"params": params}, groups, jnp.ones((b, t), jnp.int32),
                      jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)),
                      return_logits=True, skip_unmerged=True, method=HamburgerModel.base_forward)
    return out.features.astype(jnp.float16), jnp.argmax(out.logits, -1).astype(jnp.int32)

  return forward


def _examples(prompt: Sequence[int], response: Sequence[int], features, greedy, s: int):
  """One sequence's rows: positions len(prompt) - 1 .. len(seq) - 2."""
  seq = np.asarray(list(prompt) + list(response), np.int32)
  n = len(seq)
  start = len(prompt) - 1
  pos = np.arange(start, n - 1)
  offsets = np.arange(s)
  follow = pos[:, None] + 1 + offsets[None, :]
  teacher = np.where(follow < n, seq[np.minimum(follow, n - 1)], 0)
  at = pos[:, None] + offsets[None, :]
  targets = np.where(at < n - 1, greedy[np.minimum(at, n - 1)], -1)
  return features[pos], teacher.astype(np.int32), targets.astype(np.int32)


def compute_features(cfg, params, pairs: Sequence[tuple[list[int], list[int]]],
                     log_every: int = 20) -> dict[str, np.ndarray]:
  """The cache (module docstring) for `pairs`, rows in the order of `pairs`."""
  forward = _forward_fn(cfg)
  order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
  per_pair: dict[int, tuple] = {}
  i = 0
  batches = 0
  while i < len(order):
    length = len(pairs[order[i]][0]) + len(pairs[order[i]][1])
    t = -(-length // LENGTH_BUCKET) * LENGTH_BUCKET
    rows = max(1, ROWS_TOKENS // t)
    chunk = order[i:i + rows]
    t = -(-max(len(pairs[j][0]) + len(pairs[j][1]) for j in chunk) // LENGTH_BUCKET) * LENGTH_BUCKET
    # A short last chunk: rows padded to a power of two, not to the full batch.
    tokens = np.zeros((min(rows, 1 << (len(chunk) - 1).bit_length()), t), np.int32)
    for r, j in enumerate(chunk):
      seq = pairs[j][0] + pairs[j][1]
      tokens[r, :len(seq)] = seq
    feats, greedy = jax.device_get(forward(params, jnp.asarray(tokens)))
    for r, j in enumerate(chunk):
      per_pair[j] = _examples(pairs[j][0], pairs[j][1], feats[r], greedy[r], cfg.max_steps)
    i += len(chunk)
    batches += 1
    if log_every and batches % log_every == 0:
      print(f"features: {i}/{len(pairs)} answers", flush=True)
  parts = [per_pair[j] for j in range(len(pairs))]
  return {"features": np.concatenate([p[0] for p in parts]),
          "teacher": np.concatenate([p[1] for p in parts]),
          "greedy": np.concatenate([p[2] for p in parts]),
          "answer_rows": np.asarray([len(p[1]) for p in parts], np.int32)}


def with_steps(cache: dict[str, np.ndarray], s: int) -> dict[str, np.ndarray]:
  """The cache re-cut for S = s (teacher, greedy [N, s]) from its own rows, without the base: an
  answer's rows are its consecutive positions, so x_{t+k} and g_{t+k} past the cached S are the
  next rows' (0 / -1 past the answer's end, as compute_features writes them)."""
  teacher, greedy = cache["teacher"], cache["greedy"]
  out_t = np.zeros((len(teacher), s), np.int32)
  out_g = np.full((len(teacher), s), -1, np.int32)
  start = 0
  for n in np.asarray(cache["answer_rows"]).tolist():
    rows = slice(start, start + n)
    tokens = np.concatenate([teacher[rows, 0], teacher[start + n - 1, 1:], np.zeros(s, np.int32)])
    targets = np.concatenate([greedy[rows, 0], np.full(s, -1, np.int32)])
    for k in range(s):
      out_t[rows, k] = tokens[k:k + n]
      out_g[rows, k] = targets[k:k + n]
    start += n
  return {**cache, "teacher": out_t, "greedy": out_g}


def save_cache(path: str, cache: dict[str, np.ndarray]) -> None:
  """Written aside and renamed: a reader never sees a partial file (np.savez, no pickle)."""
  tmp = path + ".tmp.npz"
  np.savez(tmp, **cache)
  os.replace(tmp, path)


def load_cache(path: str) -> dict[str, np.ndarray]:
  with np.load(path, allow_pickle=False) as z:
    return {k: z[k] for k in z.files}
