"""HF Llama directories (config.json + *.safetensors) <-> base-model parameters."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np

from hamburger_jax.model.config import LlamaConfig
from hamburger_jax.convert.agreement import check_hf_config
from hamburger_jax.convert.errors import CheckpointError
from hamburger_jax.convert.safetensors_io import read_safetensors, write_safetensors
from hamburger_jax.convert.tree_map import export_from_tree, llama_map, load_into_tree
from hamburger_jax.model.llama import init_llama_params

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def read_hf_tensors(directory: str) -> dict[str, np.ndarray]:
  """All tensors of an HF directory: one `model.safetensors` or shards listed in the index."""
  single = os.path.join(directory, SINGLE_FILE)
  index = os.path.join(directory, INDEX_FILE)
  if os.path.isfile(single):
    return read_safetensors(single)[0]
  if os.path.isfile(index):
    try:
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    except (json.JSONDecodeError, KeyError) as e:
      raise CheckpointError(f"{index} is not a valid safetensors index ({e!r}).") from e
    tensors = {}
    for shard in sorted(set(weight_map.values())):
      tensors.update(read_safetensors(os.path.join(directory, shard))[0])
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
      raise CheckpointError(f"{index} lists {missing[:5]} but no shard holds them.")
    return tensors
  if any(name.endswith((".bin", ".pt", ".pth")) for name in os.listdir(directory)):
    raise CheckpointError(f"{directory} holds only pickle weights (*.bin/*.pt); they are not loaded "
                          "for safety. Convert them to safetensors first.")
  raise CheckpointError(f"{directory} has neither {SINGLE_FILE} nor {INDEX_FILE}.")


def load_hf_llama(directory: str, **config_overrides) -> tuple[LlamaConfig, dict]:
  """HF Llama directory -> (LlamaConfig, base params tree of numpy arrays)."""
  if not os.path.isdir(directory):
    raise CheckpointError(f"No such directory: {directory} (expected an HF Llama model directory).")
  check_hf_config(os.path.join(directory, "config.json"))
  cfg = LlamaConfig.from_hf_json(os.path.join(directory, "config.json"), **config_overrides)
  tensors = read_hf_tensors(directory)
  abstract = jax.eval_shape(lambda: init_llama_params(cfg, jax.random.PRNGKey(0)))

  def ignore(key: str) -> bool:   # RoPE buffers; an lm_head equal to the tied embedding
    if key.endswith("rotary_emb.inv_freq"):
      return True
    return (key == "lm_head.weight" and cfg.tie_word_embeddings
            and np.array_equal(tensors[key], tensors.get("model.embed_tokens.weight")))
  params = load_into_tree(llama_map(cfg, "", ()), tensors.__getitem__, set(tensors), abstract,
                          source=directory, ignore=ignore)
  return cfg, params


def export_hf_llama(cfg: LlamaConfig, params, directory: str) -> None:
  """Base params -> an HF directory (`config.json` + `model.safetensors`, float32 or bf16)."""
  os.makedirs(directory, exist_ok=True)
  tensors = export_from_tree(llama_map(cfg, "", ()), jax.device_get(params))
  dtypes = {str(v.dtype) for v in tensors.values()}
  write_safetensors(os.path.join(directory, SINGLE_FILE), tensors, {"format": "pt"})
  hf = cfg.to_hf_dict()
  hf["torch_dtype"] = "bfloat16" if dtypes == {"bfloat16"} else "float32"
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf, f, indent=2)
