"""Params of an export split over several safetensors files of bounded size, and read back.

    files = write_shards(directory, flat, max_bytes=16 * 2**20)   # params-00001-of-00002.safetensors
    flat = read_params(directory)        # params.safetensors, or else all of its shards

A sharded export is the same export (`hamburger_config.json` beside it) with the tensors spread
over `params-KKKKK-of-NNNNN.safetensors`; each file is a whole safetensors file of at most
`max_bytes` (header included), tensors are never split.
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Mapping

import numpy as np

from hamburger_jax.convert.errors import CheckpointError
from hamburger_jax.convert.safetensors_io import read_safetensors, write_safetensors

SINGLE = "params.safetensors"
_PATTERN = re.compile(r"params-(\d{5})-of-(\d{5})\.safetensors$")


def shard_name(index: int, count: int) -> str:
  """1-based shard `index` of `count` -> its file name."""
  return f"params-{index:05d}-of-{count:05d}.safetensors"


def _header_bytes(name: str, array: np.ndarray) -> int:
  """A generous bound of the header entry that safetensors writes for one tensor."""
  entry = {name: {"dtype": "BF16", "shape": list(array.shape), "data_offsets": [2**40, 2**40]}}
  return len(json.dumps(entry)) + 8


def plan_shards(flat: Mapping[str, np.ndarray], max_bytes: int,
                reserve: int = 4096) -> list[list[str]]:
  """Tensor names per shard, in order, each shard's data + header within `max_bytes`
  (`reserve` bytes kept for the metadata). ValueError if one tensor alone is larger."""
  groups, current, used = [], [], reserve
  for name in sorted(flat):
    size = np.asarray(flat[name]).nbytes + _header_bytes(name, np.asarray(flat[name]))
    if size + reserve > max_bytes:
      raise ValueError(f"{name} takes {size} bytes, over the {max_bytes}-byte shard limit.")
    if current and used + size > max_bytes:
      groups.append(current)
      current, used = [], reserve
    current.append(name)
    used += size
  if current:
    groups.append(current)
  return groups


def write_shards(directory: str, flat: Mapping[str, np.ndarray], max_bytes: int,
                 metadata: Mapping[str, str] | None = None) -> list[str]:
  """Writes `flat` as shards of at most `max_bytes` each into `directory` (older shards and a
  single params file there are removed first); returns the paths written."""
  os.makedirs(directory, exist_ok=True)
  for old in shard_files(directory) + glob.glob(os.path.join(directory, SINGLE)):
    os.remove(old)
  groups = plan_shards(flat, max_bytes)
  paths = []
  for i, names in enumerate(groups, 1):
    path = os.path.join(directory, shard_name(i, len(groups)))
    write_safetensors(path, {k: flat[k] for k in names}, metadata)
    if os.path.getsize(path) > max_bytes:
      raise ValueError(f"{path} is {os.path.getsize(path)} bytes, over {max_bytes}.")
    paths.append(path)
  return paths


def shard_files(directory: str) -> list[str]:
  """The shard files of `directory`, in order (empty if it has none)."""
  found = sorted(p for p in glob.glob(os.path.join(directory, "params-*-of-*.safetensors"))
                 if _PATTERN.search(os.path.basename(p)))
  return found


def read_params(directory: str, single: str = SINGLE) -> dict[str, np.ndarray]:
  """Tensors of `directory/single`, or, when that file is absent, of all its shards (every one
  of 1..N must be there, no name twice); CheckpointError naming what is missing."""
  path = os.path.join(directory, single)
  shards = shard_files(directory)
  if os.path.isfile(path) or not shards:
    return read_safetensors(path)[0]
  counts = {int(_PATTERN.search(os.path.basename(p)).group(2)) for p in shards}
  count = max(counts)
  want = [os.path.join(directory, shard_name(i, count)) for i in range(1, count + 1)]
  missing = [os.path.basename(p) for p in want if p not in shards]
  if len(counts) > 1 or missing:
    raise CheckpointError(f"{directory} holds an incomplete set of shards (missing "
                          f"{missing or 'none'}, counts {sorted(counts)}): copy all of them.")
  flat: dict[str, np.ndarray] = {}
  for p in want:
    part = read_safetensors(p)[0]
    twice = sorted(set(part) & set(flat))
    if twice:
      raise CheckpointError(f"{p} repeats {twice[:3]} of an earlier shard.")
    flat.update(part)
  return flat
