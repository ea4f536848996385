"""Decoding against references: transformers' greedy `generate` (plain decoding, and HAMburger with
groups capped at one token) and the original-layout fixture weights (teacher-forced consistency)."""

import dataclasses
import functools
import os

import jax
import numpy as np
import pytest

from tests.fixture_paths import OFFICIAL_TINY
from hamburger_jax.model.config import HamburgerConfig
from hamburger_jax.convert import load_hf_llama, load_model
from hamburger_jax.model.hamburger import init_params
from hamburger_jax.decode.sampler import Sampler
from tests.decode.helpers import check_against_teacher_forcing

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPTS = [[1, 5, 7, 90, 3], [1, 44, 2, 60, 61, 62, 8, 9, 10, 11, 12], [33]]
NEW_TOKENS = 20


@functools.lru_cache(maxsize=None)
def _hf_model_dir(tmp_root: str):
  """A random tiny LlamaForCausalLM (GQA, llama3 RoPE scaling, no EOS) saved as safetensors."""
  cfg = transformers.LlamaConfig(
      vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
      num_attention_heads=6, num_key_value_heads=2, rope_theta=10000.0,
      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
      tie_word_embeddings=False, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=None,
      pad_token_id=0, initializer_range=0.1)
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1 + 0.1 * torch.randn_like(p))
  path = os.path.join(tmp_root, "tiny_hf_llama")
  model.save_pretrained(path, safe_serialization=True)
  return model, path


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
  model, path = _hf_model_dir(str(tmp_path_factory.mktemp("hf")))
  expected = []
  for prompt in PROMPTS:
    ids = torch.tensor([prompt])
    with torch.no_grad():
      out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                           do_sample=False, eos_token_id=None, pad_token_id=0)
    expected.append(out[0, len(prompt):].tolist())
  cfg, params = load_hf_llama(path)
  return cfg, params, expected


@pytest.mark.slow
def test_plain_decoding_matches_transformers_generate(hf):
  cfg, params, expected = hf
  r = Sampler(cfg, params, cache_length=32, out_length=NEW_TOKENS).decode(
      PROMPTS, max_new_tokens=NEW_TOKENS)
  assert r.tokens == expected
  assert all(sizes == [1] * NEW_TOKENS for sizes in r.group_sizes)
  assert r.stats()["kv_slots_used"] == r.stats()["kv_slots_base"]


@pytest.mark.slow
def test_hamburger_with_group_cap_one_matches_plain_decoding(hf):
  cfg, base_params, expected = hf
  hcfg = HamburgerConfig(base=cfg, feature_layers=(0,), merger_heads=4)
  params = dict(init_params(hcfg, jax.random.PRNGKey(1)), base=base_params)
  sampler = Sampler(hcfg, params, cache_length=32, out_length=NEW_TOKENS)
  for confidence in (0.05, 0.9):
    r = sampler.decode(PROMPTS, max_new_tokens=NEW_TOKENS, confidence=confidence, max_group=1)
    assert r.tokens == expected and r.macro_steps == [NEW_TOKENS] * len(PROMPTS)
  # The same HAMburger params in plain mode decode with params["base"].
  base = Sampler(hcfg, params, base=True, cache_length=32, out_length=NEW_TOKENS)
  assert base.decode(PROMPTS, max_new_tokens=NEW_TOKENS).tokens == expected


@pytest.fixture(scope="module")
def official():
  kind, cfg, params = load_model(os.path.join(OFFICIAL_TINY, "tiny_official.ckpt"))
  assert kind == "hamburger" and cfg.base.num_layers == 16 and cfg.num_micro_layers == 4
  return cfg, params


@pytest.mark.slow
def test_official_fixture_weights_decode_consistently(official):
  cfg, params = official
  sampler = Sampler(cfg, params, cache_length=48, out_length=32)
  prompts = [[1, 20, 30, 40, 50, 60], [1, 7, 100, 200, 9, 13, 180, 5, 44]]
  mean_sizes = {}
  for confidence in (0.5, 0.9):
    r = sampler.decode(prompts, max_new_tokens=32, confidence=confidence)
    for row, prompt in enumerate(prompts):
      assert r.finish_reasons[row] in ("eos", "length")
      check_against_teacher_forcing(cfg, params, prompt, r, row, confidence,
                                    eos_ids=cfg.base.eos_token_ids)
    sizes = sum(r.group_sizes, [])
    mean_sizes[confidence] = np.mean(sizes)
  # Higher confidence -> shorter groups (closer to the base model).
  assert mean_sizes[0.5] >= mean_sizes[0.9]
