"""A draft vocabulary: micro steps >= 1 draft from the K most frequent tokens only.

    ids = most_frequent(token_lists, size=8192, vocab_size=V)   # [K] int32, most frequent first
    save(path, ids, source="...")  /  ids = load(path)
    ids = resolve(None | "full" | path, checkpoint_dir, vocab_size)   # a checkpoint's own file
    model, params = decode_model(cfg, params, draft_vocab=ids)

A draft (micro step >= 1) costs one micro-decoder step plus the LM head, and on a memory-bound
CPU the head (a read of the whole V x D table) dominates it. Drafting from K rows of the table
reads K / V of it (plus REST_SAMPLE rows, below). Micro step 0 (the base model's own next token)
keeps the full vocabulary, so `min_token_prob` 1 (no drafts) still gives the base model's answer.
A token outside the K is never drafted (its group ends; the next macro step may emit it). A
draft's probability (the `min_token_prob` gate, its reported logprob) is normalised over the K
tokens plus an estimate of the other tokens' mass from a fixed sample of REST_SAMPLE of them,
each standing for (V - K) / REST_SAMPLE (exact when they are fewer), so the gate means about what
it means over the whole vocabulary.
"""

from __future__ import annotations

import json
import os
from typing import Iterable, Sequence

import numpy as np

FORMAT = "hamburger_jax.draft_vocab/1"
FILE_NAME = "draft_vocab.json"    # a checkpoint directory's own draft vocabulary
# Other tokens whose logits estimate the probability mass outside the draft vocabulary.
REST_SAMPLE = 1024


class DraftVocabError(ValueError):
  """A draft vocabulary that cannot be used (one line: what is wrong, how to fix it)."""


def most_frequent(token_lists: Iterable[Sequence[int]], size: int, vocab_size: int) -> np.ndarray:
  """The `size` most frequent token ids of `token_lists` ([K] int32, most frequent first; ties
  and never-seen ids by ascending id)."""
  if not 1 <= size <= vocab_size:
    raise DraftVocabError(f"draft vocabulary size must be in 1..{vocab_size}, got {size}.")
  counts = np.zeros(vocab_size, np.int64)
  for tokens in token_lists:
    np.add.at(counts, np.asarray(tokens, np.int64), 1)
  order = np.lexsort((np.arange(vocab_size), -counts))       # count descending, then id
  return order[:size].astype(np.int32)


def coverage(token_lists: Iterable[Sequence[int]], ids: np.ndarray) -> float:
  """The fraction of the tokens of `token_lists` that are in `ids`."""
  member = set(int(i) for i in ids)
  total = hit = 0
  for tokens in token_lists:
    total += len(tokens)
    hit += sum(int(t) in member for t in tokens)
  return hit / max(total, 1)


def check(ids, vocab_size: int) -> np.ndarray:
  """ids -> [K] int32, or a DraftVocabError naming the problem."""
  arr = np.asarray(ids)
  if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
    raise DraftVocabError(f"a draft vocabulary is a non-empty list of token ids, got shape "
                          f"{arr.shape} of {arr.dtype}.")
  if arr.min() < 0 or arr.max() >= vocab_size:
    raise DraftVocabError(f"draft vocabulary ids must be in 0..{vocab_size - 1} (the model's "
                          f"vocabulary), got {int(arr.min())}..{int(arr.max())}.")
  if np.unique(arr).size != arr.size:
    raise DraftVocabError("draft vocabulary ids repeat: list each token id once.")
  return arr.astype(np.int32)


def save(path: str, ids, source: str, **info) -> None:
  """Writes ids [K] (with where they came from) as JSON, atomically."""
  record = {"format": FORMAT, "size": int(len(ids)), "source": source, **info,
            "ids": [int(i) for i in ids]}
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(record, f, separators=(",", ":"))
  os.replace(tmp, path)


def load(path: str, vocab_size: int | None = None) -> np.ndarray:
  """Reads a draft vocabulary file -> ids [K] int32 (checked against vocab_size if given)."""
  try:
    with open(path) as f:
      record = json.load(f)
  except FileNotFoundError:
    raise _missing(path) from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise DraftVocabError(f"{path} is not a draft vocabulary (invalid JSON: {e}); rewrite it "
                          f"with hamburger_jax.decode.draft_vocab.save.") from None
  if not isinstance(record, dict) or record.get("format") != FORMAT or "ids" not in record:
    raise DraftVocabError(f"{path} is not a draft vocabulary (expected format {FORMAT!r} with "
                          f"'ids'); rewrite it with hamburger_jax.decode.draft_vocab.save.")
  ids = record["ids"]
  if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
    raise DraftVocabError(f"{path}: 'ids' must be a list of integers.")
  return check(ids, vocab_size if vocab_size is not None else max(ids, default=0) + 1)


def _missing(path: str) -> DraftVocabError:
  return DraftVocabError(f"no draft vocabulary at {path}: pass an existing file, or 'full' for "
                         f"the whole vocabulary.")


def check_exists(choice: str | None) -> None:
  """DraftVocabError unless `choice` (as `resolve` takes it) is None, "full" or an existing file:
  checked before any weights load."""
  if choice not in (None, "full") and not os.path.isfile(choice):
    raise _missing(choice)


def resolve(choice: str | None, ckpt_dir: str | None, vocab_size: int) -> np.ndarray | None:
  """What drafts choose from: choice "full" -> None (the whole vocabulary); a path -> that file;
  None -> the checkpoint directory's own FILE_NAME if it has one, else None."""
  if choice == "full":
    return None
  if choice is None:
    choice = os.path.join(ckpt_dir, FILE_NAME) if ckpt_dir else ""
    if not os.path.isfile(choice):
      return None
  return load(choice, vocab_size)


def rest_sample(ids: np.ndarray, vocab_size: int, size: int = REST_SAMPLE):
  """A fixed sample of the token ids not in `ids` -> (ids [R] int32, the weight each stands for:
  how many of the other tokens per sampled one). All of them (weight 1) when they are <= size."""
  rest = np.setdiff1d(np.arange(vocab_size), ids).astype(np.int32)
  if rest.size <= size:
    return rest, 1.0
  sample = np.sort(np.random.default_rng(0).choice(rest, size, replace=False)).astype(np.int32)
  return sample, rest.size / size

