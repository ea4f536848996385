"""Helpers for parity tests against transformers' LlamaForCausalLM (test-only dependency)."""

import numpy as np


def tiny_hf_llama(tie: bool, seed: int = 0, layers: int = 2, scaling: bool = True):
  """A random tiny `LlamaForCausalLM` (GQA, optional llama3 RoPE scaling), eval mode, float32."""
  import torch
  from transformers import LlamaConfig, LlamaForCausalLM
  rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32} if scaling else None
  cfg = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=layers,
                    num_attention_heads=6, num_key_value_heads=2, rope_theta=10000.0,
                    rope_scaling=rope, tie_word_embeddings=tie, rms_norm_eps=1e-5,
                    bos_token_id=1, eos_token_id=2, pad_token_id=0)
  torch.manual_seed(seed)
  model = LlamaForCausalLM(cfg).eval()
  with torch.no_grad():  # non-trivial norm weights so a dropped norm is caught
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1 + 0.1 * torch.randn_like(p))
  return model


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
  import torch
  with torch.no_grad():
    return model(torch.tensor(tokens, dtype=torch.long)).logits.float().numpy()
