"""This project's params-only export: `hamburger_config.json` + `params.safetensors`.

The directory describes itself (the config travels with the weights), so `decode.py` can rebuild
the model from it alone. Keys are the '/'-joined paths of the params tree. Also here: `load_model`,
which opens any supported checkpoint (this format, an HF Llama directory, an original HAMburger
checkpoint).
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np

from hamburger_jax.model.config import HamburgerConfig, LlamaConfig
from hamburger_jax.convert import agreement
from hamburger_jax.convert.errors import CheckpointError
from hamburger_jax.convert.safetensors_io import write_safetensors
from hamburger_jax.convert.shards import read_params
from hamburger_jax.convert.tree_map import is_float_dtype
from hamburger_jax.model.hamburger import init_params

CONFIG_FILE = "hamburger_config.json"
PARAMS_FILE = "params.safetensors"


def flatten(tree) -> dict[str, np.ndarray]:
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    out["/".join(p.key for p in path)] = np.asarray(leaf)
  return out


def unflatten(flat: dict[str, np.ndarray]) -> dict:
  tree: dict = {}
  for key, value in flat.items():
    node = tree
    *parents, leaf = key.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return tree


def save_hamburger(directory: str, cfg: HamburgerConfig, params, subset: str | None = None) -> None:
  """Writes the config and params (all, or only the top-level `subset`, e.g. grafted parts)."""
  os.makedirs(directory, exist_ok=True)
  flat = flatten(jax.device_get(params))
  if subset is not None:
    flat = {k: v for k, v in flat.items() if k.split("/")[0] in subset.split(",")}
  write_safetensors(os.path.join(directory, PARAMS_FILE), flat,
                    {"format": "hamburger_jax", "subset": subset or "all"})
  with open(os.path.join(directory, CONFIG_FILE), "w") as f:
    json.dump(cfg.to_dict(), f, indent=2)


def is_hamburger_dir(path: str) -> bool:
  return os.path.isfile(os.path.join(path, CONFIG_FILE))


def load_hamburger_config(directory: str) -> HamburgerConfig:
  path = os.path.join(directory, CONFIG_FILE)
  if not os.path.isfile(path):
    raise CheckpointError(f"{directory} has no {CONFIG_FILE}: not a hamburger_jax export.")
  try:
    with open(path) as f:
      d = json.load(f)
    if not isinstance(d, dict) or not isinstance(d.get("base"), dict):
      raise CheckpointError(f"{path} is not a valid HAMburger config (no 'base' object).")
    agreement.check_config_types(HamburgerConfig, d, path)
    agreement.check_config_types(LlamaConfig, d["base"], f"{path} (base)")
    return HamburgerConfig.from_dict(d)
  except CheckpointError:
    raise
  except (json.JSONDecodeError, UnicodeDecodeError, TypeError, ValueError) as e:
    raise CheckpointError(f"{path} is not a valid HAMburger config ({e}).") from e


def load_hamburger(directory: str, base_params=None, **dtype_overrides) -> tuple[HamburgerConfig, dict]:
  """-> (config, params). A partial export (grafted modules only) needs `base_params`."""
  cfg = load_hamburger_config(directory)
  if dtype_overrides:
    import dataclasses
    cfg = cfg.replace(base=dataclasses.replace(cfg.base, **dtype_overrides))
  flat = read_params(directory, PARAMS_FILE)       # or its shards (convert/shards.py)
  if base_params is not None:
    flat = {**{f"base/{k}": v for k, v in flatten(base_params).items()}, **flat}
  abstract = flatten_abstract(cfg)
  missing = sorted(set(abstract) - set(flat))
  if missing:
    grafted_only = not any(k.startswith("base/") for k in flat)
    hint = (" (a grafted-only export: pass the base model's params)" if grafted_only else
            agreement.layer_mismatch(abstract, flat))
    raise CheckpointError(f"{directory} lacks {missing[:5]}{hint}: its config and weights "
                          "disagree.")
  agreement.check_unused(set(flat) - set(abstract), directory, abstract, flat)
  out = {}
  for key, spec in abstract.items():
    arr = flat[key]
    if tuple(arr.shape) != tuple(spec.shape):
      raise CheckpointError(f"{directory}: {key} has shape {tuple(arr.shape)}, the config expects "
                            f"{tuple(spec.shape)}.")
    if not is_float_dtype(arr.dtype):
      raise CheckpointError(f"{directory}: {key} has dtype {arr.dtype}; floating point expected.")
    out[key] = np.asarray(arr, dtype=spec.dtype)
  return cfg, unflatten(out)


def flatten_abstract(cfg: HamburgerConfig) -> dict:
  abstract = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
  return {"/".join(p.key for p in path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(abstract)}


def load_model(path: str, base_config: str | LlamaConfig | None = None):
  """Opens any supported checkpoint -> (kind, config, params).

  kind: "hamburger" (this project's export or an original checkpoint, config HamburgerConfig) or
  "llama" (an HF Llama directory, config LlamaConfig: base-model decoding only). Every weight
  must be finite (a CheckpointError names the first that is not).
  """
  kind, cfg, params = _open_model(path, base_config)
  agreement.check_finite(flatten(params), path)
  return kind, cfg, params


def _open_model(path: str, base_config):
  from hamburger_jax.convert.hf_llama import load_hf_llama
  from hamburger_jax.convert.original import load_original
  if not os.path.exists(path):
    raise CheckpointError(f"No such checkpoint: {path}.")
  if os.path.isdir(path):
    if is_hamburger_dir(path):
      cfg, params = load_hamburger(path)
      return "hamburger", cfg, params
    if os.path.isfile(os.path.join(path, "config.json")):
      cfg, params = load_hf_llama(path)
      return "llama", cfg, params
    raise CheckpointError(f"{path} is neither a hamburger_jax export ({CONFIG_FILE}) nor an HF "
                          "Llama directory (config.json).")
  if base_config is None:
    sibling = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    if not os.path.isfile(sibling):
      raise CheckpointError(f"{path} is an original HAMburger checkpoint: pass the base model's "
                            "config.json too (none found beside it).")
    base_config = sibling
  cfg, params = load_original(path, base_config)
  return "hamburger", cfg, params
