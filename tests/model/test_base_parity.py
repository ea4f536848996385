"""The base Llama equals transformers' LlamaForCausalLM on the same weights (f32, <= 1e-4)."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from hamburger_jax.convert import export_hf_llama, load_hf_llama
from hamburger_jax.convert.safetensors_io import read_safetensors, write_safetensors
from hamburger_jax.model.llama import LlamaModel
from tests.hf_utils import hf_logits, tiny_hf_llama

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.slow
def test_logits_match_transformers(tmp_path, tie):
  model = tiny_hf_llama(tie)
  model.save_pretrained(tmp_path, safe_serialization=True)
  cfg, params = load_hf_llama(str(tmp_path))
  assert cfg.tie_word_embeddings == tie and cfg.num_kv_heads == 2 and cfg.rope_scaling is not None
  # Sequences longer than original_max_position_embeddings exercise the llama3 scaling.
  tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (3, 80))
  ref = hf_logits(model, tokens)
  out = LlamaModel(cfg).apply({"params": params}, jnp.asarray(tokens))
  err = np.abs(np.asarray(out.logits) - ref).max()
  assert err <= 1e-4, err


def test_sharded_checkpoint_and_export_roundtrip(tmp_path):
  model = tiny_hf_llama(tie=False, seed=1)
  src = tmp_path / "src"
  model.save_pretrained(src, safe_serialization=True)
  # Re-shard the single file into two shards with an index, as large HF models are stored.
  tensors, _ = read_safetensors(src / "model.safetensors")
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[::2],
            "model-00002-of-00002.safetensors": names[1::2]}
  sharded = tmp_path / "sharded"
  sharded.mkdir()
  weight_map = {}
  for shard, keys in shards.items():
    write_safetensors(sharded / shard, {k: np.array(tensors[k]) for k in keys})
    weight_map.update({k: shard for k in keys})
  (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  (sharded / "config.json").write_text((src / "config.json").read_text())
  cfg, params = load_hf_llama(str(sharded))

  # Export and reload with transformers itself: same logits as the original torch model.
  out_dir = tmp_path / "export"
  export_hf_llama(cfg, params, str(out_dir))
  from transformers import LlamaForCausalLM
  reloaded = LlamaForCausalLM.from_pretrained(out_dir).eval()
  tokens = np.random.RandomState(1).randint(0, cfg.vocab_size, (2, 17))
  np.testing.assert_allclose(hf_logits(reloaded, tokens), hf_logits(model, tokens), atol=1e-6)
  assert os.path.isfile(out_dir / "config.json")
