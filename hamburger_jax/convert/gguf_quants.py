"""Whole-tensor dequantization of the GGUF block formats the shipped model uses (Q4_1, Q8_0).

The same float32 numbers as `gguf.quants.dequantize` (the same operations in the same order),
over the whole tensor at once, written in place, instead of the package's groups of 16 rows
(times: docs/results/serving.md). Other types return None (the caller uses the package).

    values = dequantize(tensor.data, tensor.tensor_type)    # [..., elements per row] float32
"""

from __future__ import annotations

import numpy as np

# name -> (block size in elements, block size in bytes)
BLOCKS = {"Q4_1": (32, 20), "Q8_0": (32, 34)}


def dequantize(data: np.ndarray, tensor_type) -> np.ndarray | None:
  """data: a tensor's bytes [..., bytes per row] uint8 -> float32 [..., elements per row], or
  None for a type this module does not handle."""
  name = getattr(tensor_type, "name", str(tensor_type))
  if name not in BLOCKS:
    return None
  elements, size = BLOCKS[name]
  rows = np.asarray(data, np.uint8)
  blocks = rows.reshape(-1, size)
  scale = blocks[:, :2].view(np.float16).astype(np.float32)               # [n, 1]
  out = np.empty((blocks.shape[0], elements), np.float32)
  if name == "Q8_0":
    out[:] = blocks[:, 2:].view(np.int8)
    out *= scale
  else:
    nibbles = blocks[:, 4:]
    np.bitwise_and(nibbles, 0x0F, out=out[:, :elements // 2], casting="unsafe")
    np.right_shift(nibbles, 4, out=out[:, elements // 2:], casting="unsafe")
    out *= scale
    out += blocks[:, 2:4].view(np.float16).astype(np.float32)              # the block's minimum
  return out.reshape(*rows.shape[:-1], rows.shape[-1] // size * elements)
