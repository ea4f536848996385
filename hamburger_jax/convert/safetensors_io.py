"""safetensors files as numpy dicts (bfloat16 included), through the `safetensors` library.

Errors become CheckpointError with the fix: the library checks the header and that the tensors'
offsets cover the file exactly, so a truncated or corrupt file never loads.
"""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np
import safetensors
import safetensors.numpy

from hamburger_jax.convert.errors import CheckpointError


def _error(path: str, e: Exception) -> CheckpointError:
  text = str(e)
  if "JSON" in text or "HeaderTooLarge" in text or "header too" in text.lower():
    return CheckpointError(f"{path} has a corrupt safetensors header ({text}). Re-download or "
                           "re-export it.")
  if "incomplete" in text or "not fully covered" in text or "too small" in text.lower():
    return CheckpointError(f"{path} is truncated or corrupt ({text}). Re-download or re-export "
                           "the file.")
  return CheckpointError(f"{path} could not be read as safetensors ({text}).")


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  """-> (name -> array, header metadata)."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise CheckpointError(f"No such file: {path}.")
  try:
    with safetensors.safe_open(path, framework="numpy") as f:
      return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
  except (safetensors.SafetensorError, OSError, ValueError) as e:
    raise _error(path, e) from e


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
  """The header metadata alone (no tensor is read)."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise CheckpointError(f"No such file: {path}.")
  try:
    with safetensors.safe_open(path, framework="numpy") as f:
      return dict(f.metadata() or {})
  except (safetensors.SafetensorError, OSError, ValueError) as e:
    raise _error(path, e) from e


def write_safetensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> None:
  """Writes name -> array as safetensors (atomically: a temp file renamed into place)."""
  arrays = {k: np.ascontiguousarray(np.asarray(v)) for k, v in tensors.items()}
  tmp = os.fspath(path) + ".tmp"
  try:
    safetensors.numpy.save_file(arrays, tmp, metadata=dict(metadata) if metadata else None)
  except (safetensors.SafetensorError, ValueError, TypeError) as e:
    raise ValueError(f"Cannot store these tensors in safetensors ({e}).") from e
  os.replace(tmp, path)
