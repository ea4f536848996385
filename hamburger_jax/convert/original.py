"""Original HAMburger checkpoints (Lightning `.ckpt` or the same state dict as `.safetensors`)."""

from __future__ import annotations

import json
import os

import jax
import numpy as np

from hamburger_jax.model.config import HamburgerConfig, LlamaConfig
from hamburger_jax.convert.agreement import check_hf_config
from hamburger_jax.convert.errors import CheckpointError
from hamburger_jax.convert.safetensors_io import read_safetensors
from hamburger_jax.convert.tree_map import KeyMap, decoder_layer_map, llama_map, load_into_tree
from hamburger_jax.model.hamburger import init_params


def original_key_map(cfg: HamburgerConfig) -> KeyMap:
  """Original state-dict keys -> this project's HAMburger params."""
  out = llama_map(cfg.base, "model.", ("base",))
  emb = ("embedder",)
  out["comp_embedder.merger.pos"] = (emb + ("pos",), False)
  for name in ("q_proj", "k_proj", "v_proj"):
    out[f"comp_embedder.merger.{name}.weight"] = (emb + (name, "kernel"), True)
    out[f"comp_embedder.merger.{name}.bias"] = (emb + (name, "bias"), False)
  out["comp_embedder.out_proj.weight"] = (emb + ("out_proj", "kernel"), True)
  out["comp_embedder.out_proj.bias"] = (emb + ("out_proj", "bias"), False)
  for i in range(cfg.num_micro_layers):
    out.update(decoder_layer_map(f"micro_step_decoder.decoders.{i}.",
                                 ("micro_decoder", f"layers_{i}")))
  for i, torch_index in enumerate((0, 2, 4)):
    for kind, leaf, t in (("weight", "kernel", True), ("bias", "bias", False)):
      out[f"micro_step_decoder.stop_head.{torch_index}.{kind}"] = (
          ("micro_decoder", "stop_head", f"dense_{i}", leaf), t)
  return out


_MODEL_PREFIXES = ("model.", "comp_embedder.", "micro_step_decoder.")
_TIED = {"model.lm_head.weight": "model.model.embed_tokens.weight",
         "comp_embedder.embedding.weight": "model.model.embed_tokens.weight"}


def _ignorable(tensors: dict[str, np.ndarray]):
  """Unused entries that are fine: non-model state (optimizer, ...), RoPE buffers, tied copies."""
  def ignore(key: str) -> bool:
    if not key.startswith(_MODEL_PREFIXES) or key.endswith("rotary_emb.inv_freq"):
      return True
    tied = _TIED.get(key)
    return tied in tensors and np.array_equal(tensors[key], tensors[tied])
  return ignore


def _read_ckpt(path: str) -> tuple[dict[str, np.ndarray], dict]:
  try:
    import torch  # optional: only needed for .ckpt files
  except ImportError as e:
    raise CheckpointError(f"Reading {path} needs PyTorch (pip install torch==2.13.0), or convert "
                          "the checkpoint to .safetensors and load that.") from e
  try:
    blob = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # torch raises several types for truncated / foreign files
    raise CheckpointError(f"{path} could not be read as a torch checkpoint ({type(e).__name__}: "
                          f"{str(e)[:200]}). It may be truncated or not a weights-only file.") from e
  if not isinstance(blob, dict):
    raise CheckpointError(f"{path} holds a {type(blob).__name__}, not a checkpoint dict.")
  state = blob.get("state_dict", blob)
  hyper = blob.get("hyper_parameters") or {}
  tensors = {}
  for k, v in state.items():
    if isinstance(v, torch.Tensor):
      v = v.detach()
      tensors[k] = (v.float() if v.is_floating_point() else v).numpy()
  return tensors, dict(hyper)


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
  tensors, metadata = read_safetensors(path)
  tied = metadata.get("tied_weights")
  if tied:
    try:
      aliases = json.loads(tied)
    except json.JSONDecodeError as e:
      raise CheckpointError(f"{path}: metadata 'tied_weights' is not JSON ({e}).") from e
    for alias, key in aliases.items():
      if key in tensors:
        tensors.setdefault(alias, tensors[key])
  return tensors


def load_original(path: str, base_config: LlamaConfig | str,
                  **hamburger_overrides) -> tuple[HamburgerConfig, dict]:
  """An original checkpoint (+ the base model's config) -> (HamburgerConfig, params).

  `base_config` is a LlamaConfig or the path of the base model's HF `config.json`. Entries outside
  the model (optimizer state, ...) and tied copies are ignored; any other tensor the config has no
  place for is a CheckpointError. Every tensor is cast to the parameter dtype.
  """
  if not os.path.isfile(path):
    raise CheckpointError(f"No such checkpoint file: {path}.")
  if isinstance(base_config, (str, os.PathLike)):
    check_hf_config(os.fspath(base_config))
    base_config = LlamaConfig.from_hf_json(base_config)
  if path.endswith(".safetensors"):
    tensors, hyper = _read_safetensors(path), {}
  else:
    tensors, hyper = _read_ckpt(path)
  if "max_steps" in hyper and "max_steps" not in hamburger_overrides:
    hamburger_overrides["max_steps"] = int(hyper["max_steps"])
  cfg = HamburgerConfig(base=base_config, **hamburger_overrides)
  abstract = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
  params = load_into_tree(original_key_map(cfg), tensors.__getitem__, set(tensors), abstract,
                          source=path, ignore=_ignorable(tensors))
  return cfg, params
