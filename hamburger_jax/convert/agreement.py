"""Strict agreement between a checkpoint's config and its weights: typed config fields, every
tensor used, layer counts named, every weight finite. Each failure is a CheckpointError.

    check_config_types(LlamaConfig, d, source)      # ints are ints: 256, not 256.0 or "256"
    check_hf_config(path)                           # the same for an HF config.json
    check_unused(unused_keys, source, want, have)   # tensors the config has no place for
    check_finite(flat_params, source)               # NaN / inf weights
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from typing import Iterable, Mapping

import numpy as np

from hamburger_jax.convert.errors import CheckpointError

_LAYER = re.compile(r"^(.*?(?:layers|decoders))[._](\d+)[./]")
_HF_INTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim")
_HF_FLOATS = ("rope_theta", "rms_norm_eps")


def _type_problem(value, kind: str) -> str | None:
  """None if `value` fits the annotation `kind` ('int', 'float', 'int | None', 'bool', ...)."""
  kind = kind.replace(" ", "")
  if "None" in kind.split("|") and value is None:
    return None
  base = kind.split("|")[0]
  if base == "int" and (isinstance(value, bool) or not isinstance(value, int)):
    return "an integer"
  if base == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
    return "a number"
  if base == "bool" and not isinstance(value, bool):
    return "true or false"
  if base == "str" and not isinstance(value, str):
    return "a string"
  if base.startswith("tuple[int") and not (isinstance(value, (list, tuple)) and all(
      isinstance(v, int) and not isinstance(v, bool) for v in value)):
    return "a list of integers"
  return None


def check_config_types(cls, d: Mapping, source: str) -> None:
  """CheckpointError naming the first field of dataclass `cls` whose value has the wrong type."""
  for field in dataclasses.fields(cls):
    if field.name in d:
      want = _type_problem(d[field.name], str(field.type))
      if want:
        raise CheckpointError(f"{source}: {field.name} must be {want}, got {d[field.name]!r}.")


def check_hf_config(path: str) -> None:
  """CheckpointError for an HF config.json whose sizes are not integers (or are < 1)."""
  try:
    with open(path) as f:
      d = json.load(f)
  except (OSError, json.JSONDecodeError, UnicodeDecodeError):
    return                     # LlamaConfig.from_hf_json reports unreadable files
  if not isinstance(d, dict):
    raise CheckpointError(f"{path} holds a JSON {type(d).__name__}, not a config object.")
  for key in _HF_INTS:
    v = d.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
      raise CheckpointError(f"{path}: {key} must be a positive integer, got {v!r}.")
  for key in _HF_FLOATS:
    v = d.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
      raise CheckpointError(f"{path}: {key} must be a number, got {v!r}.")


def layer_counts(keys: Iterable[str]) -> dict[str, int]:
  """{'model.layers': 16, ...}: distinct layer indices under each `...layers.N.` prefix."""
  seen = collections.defaultdict(set)
  for k in keys:
    m = _LAYER.match(k)
    if m:
      seen[m.group(1)].add(int(m.group(2)))
  return {prefix: len(ids) for prefix, ids in seen.items()}


def layer_mismatch(want_keys: Iterable[str], have_keys: Iterable[str]) -> str:
  """'; it holds 4 layers under base/layers but the config gives 3' (or '' if counts agree)."""
  want, have = layer_counts(want_keys), layer_counts(have_keys)
  diffs = [f"{have.get(p, 0)} layers under {p} but the config gives {n}"
           for p, n in sorted(want.items()) if have.get(p, 0) != n]
  return f"; it holds {', '.join(diffs)}" if diffs else ""


def check_unused(unused: Iterable[str], source: str, want_keys: Iterable[str],
                 have_keys: Iterable[str]) -> None:
  """CheckpointError if the checkpoint has weights the config does not use."""
  unused = sorted(unused)
  if not unused:
    return
  more = f" (and {len(unused) - 5} more)" if len(unused) > 5 else ""
  raise CheckpointError(f"{source} has weights its config does not use: {unused[:5]}{more}"
                        f"{layer_mismatch(want_keys, have_keys)}. The config and the weights "
                        "disagree: fix the config (layer counts) or use the matching checkpoint.")


def check_finite(flat: Mapping[str, np.ndarray], source: str) -> None:
  """CheckpointError naming the first weight that holds NaN or inf."""
  for key, arr in flat.items():
    arr = np.asarray(arr)
    if arr.dtype.kind == "f" or arr.dtype.name == "bfloat16":
      bad = int(arr.size - np.count_nonzero(np.isfinite(arr.astype(np.float32, copy=False))))
      if bad:
        raise CheckpointError(f"{source}: {key} holds {bad} NaN/inf values: the checkpoint is "
                              "corrupt or comes from a diverged run.")
