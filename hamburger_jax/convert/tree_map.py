"""Name maps between torch state dicts and this project's parameter trees.

A map is {torch key: (path in the params tree, transpose?)}. Torch `nn.Linear.weight` is
[out, in]; a Flax Dense kernel is [in, out], hence the transpose.
"""

from __future__ import annotations

from typing import Callable, Mapping

import jax
import ml_dtypes
import numpy as np

from hamburger_jax.convert import agreement
from hamburger_jax.convert.errors import CheckpointError

KeyMap = dict[str, tuple[tuple[str, ...], bool]]

_LAYER_LINEARS = {
    "self_attn.q_proj": ("self_attn", "q_proj"), "self_attn.k_proj": ("self_attn", "k_proj"),
    "self_attn.v_proj": ("self_attn", "v_proj"), "self_attn.o_proj": ("self_attn", "o_proj"),
    "mlp.gate_proj": ("mlp", "gate_proj"), "mlp.up_proj": ("mlp", "up_proj"),
    "mlp.down_proj": ("mlp", "down_proj"),
}
_LAYER_NORMS = ("input_layernorm", "post_attention_layernorm")


def decoder_layer_map(torch_prefix: str, path: tuple[str, ...]) -> KeyMap:
  """One HF Llama decoder layer at `torch_prefix` ("model.layers.3.") -> params at `path`."""
  out: KeyMap = {}
  for name, sub in _LAYER_LINEARS.items():
    out[f"{torch_prefix}{name}.weight"] = (path + sub + ("kernel",), True)
  for name in _LAYER_NORMS:
    out[f"{torch_prefix}{name}.weight"] = (path + (name, "scale"), False)
  return out


def llama_map(cfg, torch_prefix: str, path: tuple[str, ...]) -> KeyMap:
  """A whole HF `LlamaForCausalLM` (`torch_prefix` = "" for HF, "model." in the original)."""
  out: KeyMap = {
      f"{torch_prefix}model.embed_tokens.weight": (path + ("embed_tokens", "embedding"), False),
      f"{torch_prefix}model.norm.weight": (path + ("norm", "scale"), False),
  }
  for i in range(cfg.num_layers):
    out.update(decoder_layer_map(f"{torch_prefix}model.layers.{i}.", path + (f"layers_{i}",)))
  if not cfg.tie_word_embeddings:
    out[f"{torch_prefix}lm_head.weight"] = (path + ("lm_head", "kernel"), True)
  return out


def _get(tree, path):
  for p in path:
    tree = tree[p]
  return tree


def _set(tree, path, value):
  for p in path[:-1]:
    tree = tree.setdefault(p, {})
  tree[path[-1]] = value


def is_float_dtype(dtype) -> bool:
  """True for numpy floats and ml_dtypes' bfloat16 (which numpy does not count as floating)."""
  return np.issubdtype(dtype, np.floating) or dtype == ml_dtypes.bfloat16


def load_into_tree(key_map: KeyMap, get_tensor: Callable[[str], np.ndarray], available: set[str],
                   abstract_params, source: str, ignore: Callable[[str], bool] | None = None):
  """Fills a params tree shaped like `abstract_params` (ShapeDtypeStructs) from torch tensors.

  Casts each tensor to the parameter's dtype; raises CheckpointError on a missing tensor, a
  tensor the map does not use (unless `ignore(key)`: optimizer state, tied copies), a wrong shape
  or a non-floating dtype, naming the key and any layer-count disagreement.
  """
  missing = sorted(k for k in key_map if k not in available)
  if missing:
    more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
    raise CheckpointError(f"{source} lacks the weights {missing[:5]}{more}"
                          f"{agreement.layer_mismatch(key_map, available)}: it is not a "
                          "checkpoint of this model configuration.")
  ignore = ignore or (lambda key: False)
  agreement.check_unused((k for k in available - set(key_map) if not ignore(k)), source,
                         key_map, available)
  params: dict = {}
  for key, (path, transpose) in key_map.items():
    target = _get(abstract_params, path)
    arr = get_tensor(key)
    if not is_float_dtype(arr.dtype):
      raise CheckpointError(f"{source}: {key} has dtype {arr.dtype}; a floating-point weight is "
                            "expected.")
    if transpose:
      arr = arr.T if arr.ndim == 2 else arr
    if tuple(arr.shape) != tuple(target.shape):
      raise CheckpointError(f"{source}: {key} has shape {tuple(arr.shape)[::-1] if transpose else tuple(arr.shape)}"
                            f" but the model expects {tuple(target.shape)[::-1] if transpose else tuple(target.shape)}"
                            " (torch layout): the checkpoint does not match the model config.")
    _set(params, path, np.asarray(arr, dtype=target.dtype))
  _check_complete(abstract_params, params, source)
  return params


def _check_complete(abstract_params, params, source):
  want = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(abstract_params)}
  have = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)}
  if want != have:
    raise CheckpointError(f"{source}: parameters not covered by the checkpoint map: "
                          f"{sorted(want - have)[:5]}")


def export_from_tree(key_map: KeyMap, params: Mapping) -> dict[str, np.ndarray]:
  """The inverse of `load_into_tree`: params -> {torch key: array in torch layout}."""
  out = {}
  for key, (path, transpose) in key_map.items():
    arr = np.asarray(_get(params, path))
    out[key] = np.ascontiguousarray(arr.T if transpose else arr)
  return out
