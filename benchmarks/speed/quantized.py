"""`python -m benchmarks.quality --quantize int8`: int8 weight-only decoding of the shipped model's
base against float32, in one run.

    python -m benchmarks.quality --quantize int8 --num_prompts 32 --max_new_tokens 48
    python -m benchmarks.quality --quantize int8 --num_prompts 2 --max_new_tokens 8 --out_dir ''

The base of `--ckpt smollm2` (SmolLM2-135M-Instruct) decodes the held-out prompts
(hamburger_jax/recipes/heldout.py, chat template) greedily with its float32 weights and with int8
weights (hamburger_jax/model/quantize.py). Measured:
- nll: the base's mean NLL per token of the reference answers (the float32 base's own greedy
  answers) under float32 and under int8 weights;
- agreement: the fraction of the reference answers' tokens the int8 base's greedy answer repeats
  position for position (and the fraction of answers identical to the end);
- tokens/s of each, batch by batch interleaved (robust to a changing load), compile excluded;
- the weight bytes each decode step reads.
Writes quantized.json (with provenance) to --out_dir (default docs/results/data/quality/).
"""

import json
import os
import time

import numpy as np

from benchmarks.common import machine, markdown_table, write_json
from hamburger_jax.decode import evaluation
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.model import quantize
from hamburger_jax.recipes.heldout import heldout_prompts
from hamburger_jax.shipped import smollm2


def agreement(reference, other) -> tuple[float, float]:
  """-> (fraction of the reference tokens that `other` repeats at the same position, fraction
  of answers identical)."""
  same = sum(int(np.sum(np.asarray(r[:len(o)]) == np.asarray(o[:len(r)])))
             for r, o in zip(reference, other))
  total = max(sum(len(r) for r in reference), 1)
  return same / total, float(np.mean([list(r) == list(o) for r, o in zip(reference, other)]))


def decode_interleaved(samplers: dict, prompts, batch_size: int, max_new_tokens: int) -> dict:
  """name -> {"tokens": answers, "decode_s": seconds}: the samplers take turns batch by batch
  (each batch's shapes compiled before it is timed)."""
  out = {name: {"tokens": [], "decode_s": 0.0} for name in samplers}
  for start in range(0, len(prompts), batch_size):
    batch = prompts[start:start + batch_size]
    for name, sampler in samplers.items():
      result = sampler.decode(batch, max_new_tokens=max_new_tokens)
      if result.compile_s > 0:                  # compiled now: time it again, compiled
        result = sampler.decode(batch, max_new_tokens=max_new_tokens)
      out[name]["tokens"] += result.tokens
      out[name]["decode_s"] += result.decode_s
  return out


def measure(base_cfg, base_params, prompts, max_new_tokens: int, batch_size: int) -> dict:
  """The rows of the float32 and int8 base (see the module docstring)."""
  kw = dict(cache_length=max(len(p) for p in prompts) + max_new_tokens,
            out_length=max_new_tokens, min_prompt_bucket=16)
  int8_params = quantize.quantize_params(base_params, base_cfg)
  samplers = {"float32": Sampler(base_cfg, base_params, **kw),
              "int8": Sampler(base_cfg, int8_params, **kw)}
  runs = decode_interleaved(samplers, prompts, batch_size, max_new_tokens)
  reference = runs["float32"]["tokens"]
  rows = []
  for name, params in (("float32", base_params), ("int8", int8_params)):
    scorer = evaluation.BaseScorer(base_cfg, params)
    same, identical = agreement(reference, runs[name]["tokens"])
    new_tokens = sum(len(t) for t in runs[name]["tokens"])
    rows.append({"weights": name, "nll": scorer.mean_nll(prompts, reference),
                 "greedy_agreement": same, "answers_identical": identical,
                 "new_tokens": new_tokens, "decode_s": runs[name]["decode_s"],
                 "tokens_per_s": new_tokens / max(runs[name]["decode_s"], 1e-9),
                 "weight_bytes": quantize.weight_bytes(params)})
  rows[1]["nll_ratio"] = rows[1]["nll"] / rows[0]["nll"]
  rows[1]["speedup"] = rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]
  return {"rows": rows, "bf16_weight_bytes": quantize.weight_bytes(base_params) // 2}


def format_table(result: dict) -> str:
  header = ["weights", "weight MB", "NLL of the references", "greedy agreement",
            "answers identical", "tokens/s"]
  rows = [[r["weights"], f"{r['weight_bytes'] / 1e6:.1f}",
           f"{r['nll']:.4f}" + (f" ({r['nll_ratio']:.3f}x)" if "nll_ratio" in r else ""),
           f"{r['greedy_agreement']:.3f}", f"{r['answers_identical']:.3f}",
           f"{r['tokens_per_s']:.1f}" + (f" ({r['speedup']:.2f}x)" if "speedup" in r else "")]
          for r in result["rows"]]
  return markdown_table(header, rows)


def run(args, module: str, argv=None) -> dict:
  """The measurement for quality.py's parsed args (num_prompts, max_new_tokens, batch_size,
  asset_dir, out_dir); prints the table and the JSON, writes quantized.json."""
  t0 = time.time()
  _, params, tok, base_cfg = smollm2.load_shipped(args.asset_dir)
  items = heldout_prompts(args.num_prompts, args.prompt_set)
  prompts = [tok.encode(p["prompt"], chat=True, system=smollm2.SYSTEM_PROMPT) for p in items]
  result = measure(base_cfg, params["base"], prompts, args.max_new_tokens, args.batch_size)
  result.update(num_prompts=len(prompts), prompt_set=args.prompt_set,
                max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                seconds=time.time() - t0, machine=machine())
  print(format_table(result))
  write_json(result, args.out_dir and os.path.join(args.out_dir, "quantized.json"), module, argv)
  print(json.dumps(result))
  return result
