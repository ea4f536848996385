"""A small, strict safetensors reader/writer on numpy (bfloat16 via ml_dtypes).

The format: 8-byte little-endian header size, a JSON header mapping names to
{dtype, shape, data_offsets}, then the raw bytes. Reading memory-maps the file and checks every
offset against the file size, so a truncated or corrupt file fails with a clear message.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Mapping

import ml_dtypes
import numpy as np

from hamburger_jax.convert.errors import CheckpointError

_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  """-> (name -> array (read-only memory map), header metadata)."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise CheckpointError(f"No such file: {path}.")
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise CheckpointError(f"{path} is not a safetensors file: it is only {size} bytes long.")
    (n,) = struct.unpack("<Q", head)
    if n > size - 8 or n > 100_000_000:
      raise CheckpointError(f"{path} is truncated or not a safetensors file (header of {n} bytes "
                            f"in a {size}-byte file). Re-download or re-export it.")
    try:
      header = json.loads(f.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise CheckpointError(f"{path} has a corrupt safetensors header ({e}).") from e
  metadata = header.pop("__metadata__", None) or {}
  data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n, shape=(size - 8 - n,)) \
      if size > 8 + n else np.zeros((0,), np.uint8)
  out = {}
  for name, info in header.items():
    try:
      dtype = _DTYPES[info["dtype"]]
      shape = tuple(info["shape"])
      begin, end = info["data_offsets"]
    except (KeyError, TypeError, ValueError) as e:
      raise CheckpointError(f"{path}: tensor {name!r} has a malformed header entry {info!r}.") from e
    if end > len(data) or end - begin != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
      raise CheckpointError(f"{path} is truncated or corrupt: tensor {name!r} needs bytes "
                            f"{begin}..{end} but the data section has {len(data)}. "
                            "Re-download or re-export the file.")
    out[name] = data[begin:end].view(dtype).reshape(shape)
  return out, metadata


def write_safetensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> None:
  """Writes name -> array as safetensors (atomically: a temp file renamed into place)."""
  header, offset, blobs = {}, 0, []
  for name in sorted(tensors):
    arr = np.ascontiguousarray(np.asarray(tensors[name]))
    if arr.dtype not in _NAMES:
      raise ValueError(f"Cannot store dtype {arr.dtype} of {name!r} in safetensors.")
    blob = arr.tobytes()
    header[name] = {"dtype": _NAMES[arr.dtype], "shape": list(arr.shape),
                    "data_offsets": [offset, offset + len(blob)]}
    blobs.append(blob)
    offset += len(blob)
  if metadata:
    header["__metadata__"] = dict(metadata)
  raw = json.dumps(header, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)
  tmp = os.fspath(path) + ".tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    for blob in blobs:
      f.write(blob)
  os.replace(tmp, path)
