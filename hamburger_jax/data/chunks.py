"""Segmented examples saved chunk by chunk while preparing, so a crash loses at most one chunk.

A `ChunkStore` lives in `DATA_DIR/.work/NAME-VERSION-FINGERPRINT/`; the fingerprint covers the
settings and the tokenized data, so a re-run with the same inputs resumes where it stopped and a
run with other inputs starts afresh. Chunks are written atomically (temp file + rename).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any, Iterable, Sequence

import numpy as np

from hamburger_jax.data.segmentation import SegmentedExample


def fingerprint(settings: Any, arrays: Iterable[np.ndarray]) -> str:
  """A short hash of JSON-able settings and the bytes of the arrays."""
  h = hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode())
  for a in arrays:
    h.update(np.ascontiguousarray(a, np.int32).tobytes())
    h.update(b"|")
  return h.hexdigest()[:16]


class ChunkStore:
  """Numbered .npz chunks of SegmentedExamples."""

  def __init__(self, root: str):
    self.root = root
    os.makedirs(root, exist_ok=True)

  def path(self, i: int) -> str:
    return os.path.join(self.root, f"chunk_{i:05d}.npz")

  def has(self, i: int) -> bool:
    return os.path.isfile(self.path(i))

  def save(self, i: int, examples: Sequence[SegmentedExample]) -> None:
    tmp = self.path(i) + ".tmp.npz"
    np.savez(tmp,
             tokens=np.concatenate([e.tokens for e in examples]).astype(np.int32),
             token_counts=np.asarray([len(e.tokens) for e in examples], np.int64),
             prompt_lengths=np.asarray([e.prompt_length for e in examples], np.int32),
             steps=np.concatenate([e.steps for e in examples]).astype(np.int32),
             step_counts=np.asarray([len(e.steps) for e in examples], np.int64))
    os.replace(tmp, self.path(i))

  def load(self, i: int) -> list[SegmentedExample]:
    with np.load(self.path(i)) as z:
      tokens = np.split(z["tokens"], np.cumsum(z["token_counts"])[:-1])
      steps = np.split(z["steps"], np.cumsum(z["step_counts"])[:-1])
      return [SegmentedExample(t, int(p), s)
              for t, p, s in zip(tokens, z["prompt_lengths"], steps)]

  def clear(self) -> None:
    shutil.rmtree(self.root, ignore_errors=True)
