"""`python -m benchmarks.quality --quantize int8`: weight formats of the shipped model's base
against float32, in one run.

    python -m benchmarks.quality --quantize int8 --num_prompts 32 --max_new_tokens 48
    python -m benchmarks.quality --quantize int8,int8:192,int8:64,bf16 --num_prompts 32 \
        --max_new_tokens 48
    python -m benchmarks.quality --quantize int8 --num_prompts 2 --max_new_tokens 8 --out_dir ''

The base of `--ckpt smollm2` (SmolLM2-135M-Instruct) decodes the held-out prompts
(hamburger_jax/recipes/heldout.py, chat template) greedily with its float32 weights and with each
weight set --quantize lists (comma-separated): "int8" (per-channel scales), "int8:G" (a scale
per group of G inputs; hamburger_jax/model/quantize.py) or "bf16" (every param rounded to
bfloat16 and back to float32: what any 16-bit weight format keeps) or "kv-int8" (float32
weights, int8 KV buffers: model/kv_cache.py; its teacher-forced figures come from a cached
forward that reads the stored keys and values). Measured per weight set:
- nll: the base's mean NLL per token of the reference answers (the float32 base's own greedy
  answers), teacher forced;
- top_token_agreement: in the same forward (prompt + reference), the fraction of the reference
  positions whose top token is float32's;
- greedy_agreement: the fraction of the reference answers' tokens its own greedy answer repeats
  position for position (and the fraction of answers identical to the end);
- tokens/s, the weight sets batch by batch interleaved (robust to a changing load), compile
  excluded (bf16 decodes float32 params holding bf16 values: float32's speed);
- the weight bytes each decode step reads (bf16: the bfloat16 params' bytes).
Writes quantized.json (--quantize int8), quantized_kv.json (a list with kv-int8) or
quantized_groups.json (any other list), with provenance, to --out_dir (default
docs/results/data/quality/).
"""

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import machine, markdown_table, write_json
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.model import quantize
from hamburger_jax.model.kv_cache import init_cache
from hamburger_jax.model.llama import LlamaModel
from hamburger_jax.model.scoring import Scorer
from hamburger_jax.recipes.heldout import heldout_prompts
from hamburger_jax.shipped import smollm2

BF16 = "bf16"
BF16_NAME = "bf16-rounded"
KV_INT8 = "kv-int8"              # float32 weights, int8 KV buffers (model/kv_cache.py)


def parse_modes(text: str) -> list[str]:
  """"int8,int8:64,bf16" -> the list; ValueError (one line) for an item that is neither "bf16"
  nor an int8 quantize mode."""
  modes = [m.strip() for m in text.split(",") if m.strip()]
  for mode in modes:
    if mode not in (BF16, KV_INT8) and quantize.parse_mode(mode) is None:
      raise ValueError(f"--quantize lists weight sets beside float32: int8, int8:G, bf16 or "
                       f"kv-int8, got {mode!r}.")
  if not modes or len(set(modes)) != len(modes):
    raise ValueError(f"--quantize: give each weight set once, got {text!r}.")
  return modes


def out_name(modes) -> str:
  """The JSON file a run writes: quantized.json for int8 alone, quantized_kv.json with kv-int8,
  else quantized_groups.json."""
  if list(modes) == ["int8"]:
    return "quantized.json"
  return "quantized_kv.json" if KV_INT8 in modes else "quantized_groups.json"


def agreement(reference, other) -> tuple[float, float]:
  """-> (fraction of the reference tokens that `other` repeats at the same position, fraction
  of answers identical)."""
  same = sum(int(np.sum(np.asarray(r[:len(o)]) == np.asarray(o[:len(r)])))
             for r, o in zip(reference, other))
  total = max(sum(len(r) for r in reference), 1)
  return same / total, float(np.mean([list(r) == list(o) for r, o in zip(reference, other)]))


def weight_sets(base_cfg, base_params, modes) -> dict:
  """name -> (params, weight bytes a step reads): float32 first, then each mode's (all made
  before any decoding: a group size the widths refuse stops the run here)."""
  sets = {"float32": (base_params, quantize.weight_bytes(base_params))}
  for mode in modes:
    if mode == BF16:
      half = jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), base_params)
      sets[BF16_NAME] = (jax.tree.map(lambda x: x.astype(jnp.float32), half),
                         quantize.weight_bytes(half))
    elif mode == KV_INT8:
      sets[KV_INT8] = sets["float32"]
    else:
      params = quantize.apply_mode(base_params, base_cfg, mode)
      sets[mode] = (params, quantize.weight_bytes(params))
  return sets


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


def teacher_forced(base_cfg, sets: dict, prompts, reference) -> dict:
  """name -> (mean NLL per reference token, fraction of reference positions whose top token is
  float32's): one forward of each prompt + reference [L_i] per weight set."""
  seqs = [np.asarray(list(p) + list(r), np.int32) for p, r in zip(prompts, reference)]
  max_length = max(len(s) for s in seqs)
  tops, out = {}, {}
  for name, (params, _) in sets.items():
    if name == KV_INT8:
      scored = cached_top_tokens(base_cfg, params, seqs, "int8")
    else:
      scored = Scorer(base_cfg, params, metric="nll", max_length=max_length).top_log_probs(seqs,
                                                                                          1)
    # log p of token i sits at i; the top token after position i at i (it predicts i + 1).
    nll = -sum(float(np.sum(logp[len(p):])) for p, (logp, _, _) in zip(prompts, scored))
    tops[name] = [ids[len(p) - 1:-1, 0] for p, (_, ids, _) in zip(prompts, scored)]
    out[name] = nll / max(sum(len(r) for r in reference), 1)
  same = lambda name: sum(int(np.sum(a == b)) for a, b in zip(tops[name], tops["float32"]))
  positions = max(sum(len(t) for t in tops["float32"]), 1)
  return {name: (nll, same(name) / positions) for name, nll in out.items()}


def cached_top_tokens(base_cfg, params, seqs, kv_dtype: str) -> list[tuple]:
  """As `Scorer.top_log_probs(seqs, 1)`, through a cached forward: each sequence is prefilled
  into KV buffers that store `kv_dtype`, so every query reads the stored keys and values."""
  length = -(-max(len(s) for s in seqs) // 64) * 64

  @jax.jit
  def logits(tokens):
    cache = init_cache(base_cfg, base_cfg.num_layers, 1, length, kv_dtype)
    out = LlamaModel(base_cfg).apply({"params": params}, tokens, cache=cache,
                                     cache_slots=jnp.zeros((1,), jnp.int32))
    return jax.nn.log_softmax(out.logits[0].astype(jnp.float32), axis=-1)

  scored = []
  for seq in seqs:
    logp = np.asarray(logits(jnp.asarray(np.pad(seq, (0, length - len(seq)))[None])))[:len(seq)]
    token_logp = np.concatenate([[0.0], logp[np.arange(len(seq) - 1), seq[1:]]])
    top = np.argmax(logp, axis=-1)[:, None]
    scored.append((token_logp, top, np.take_along_axis(logp, top, axis=-1)))
  return scored


def measure(base_cfg, base_params, prompts, max_new_tokens: int, batch_size: int,
            modes=("int8",)) -> dict:
  """The rows of float32 and of each weight set in `modes` (see the module docstring)."""
  kw = dict(cache_length=max(len(p) for p in prompts) + max_new_tokens,
            out_length=max_new_tokens, min_prompt_bucket=16)
  sets = weight_sets(base_cfg, base_params, modes)
  samplers = {name: Sampler(base_cfg, params, kv_cache="int8" if name == KV_INT8 else "model",
                           **kw) for name, (params, _) in sets.items()}
  runs = decode_interleaved(samplers, prompts, batch_size, max_new_tokens)
  reference = runs["float32"]["tokens"]
  scores = teacher_forced(base_cfg, sets, prompts, reference)
  rows = []
  for name, (_, nbytes) in sets.items():
    same, identical = agreement(reference, runs[name]["tokens"])
    new_tokens = sum(len(t) for t in runs[name]["tokens"])
    rows.append({"weights": name, "nll": scores[name][0], "top_token_agreement": scores[name][1],
                 "greedy_agreement": same, "answers_identical": identical,
                 "new_tokens": new_tokens, "decode_s": runs[name]["decode_s"],
                 "tokens_per_s": new_tokens / max(runs[name]["decode_s"], 1e-9),
                 "weight_bytes": nbytes})
  for row in rows[1:]:
    row["nll_ratio"] = row["nll"] / rows[0]["nll"]
    row["speedup"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
  return {"rows": rows, "modes": list(modes),
          "reference_tokens": sum(len(r) for r in reference),
          "bf16_weight_bytes": quantize.weight_bytes(base_params) // 2}


def format_table(result: dict) -> str:
  header = ["weights", "weight MB", "NLL of the references", "greedy agreement",
            "answers identical", "top-token agreement (teacher forced)", "tokens/s"]
  rows = [[r["weights"], f"{r['weight_bytes'] / 1e6:.1f}",
           f"{r['nll']:.4f}" + (f" ({r['nll_ratio']:.3f}x)" if "nll_ratio" in r else ""),
           f"{r['greedy_agreement']:.3f}", f"{r['answers_identical']:.3f}",
           f"{r['top_token_agreement']:.3f}" if "top_token_agreement" in r else "-",
           f"{r['tokens_per_s']:.1f}" + (f" ({r['speedup']:.2f}x)" if "speedup" in r else "")]
          for r in result["rows"]]
  return markdown_table(header, rows)


def run(args, module: str, argv=None) -> dict:
  """The measurement for quality.py's parsed args (quantize, num_prompts, max_new_tokens,
  batch_size, asset_dir, out_dir); prints the table and the JSON, writes `out_name`'s file."""
  t0 = time.time()
  modes = parse_modes(args.quantize)
  _, params, tok, base_cfg = smollm2.load_shipped(args.asset_dir)
  items = heldout_prompts(args.num_prompts, args.prompt_set)
  prompts = [tok.encode(p["prompt"], chat=True, system=smollm2.SYSTEM_PROMPT) for p in items]
  result = measure(base_cfg, params["base"], prompts, args.max_new_tokens, args.batch_size,
                   modes)
  result.update(num_prompts=len(prompts), prompt_set=args.prompt_set,
                max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                seconds=time.time() - t0, machine=machine())
  print(format_table(result))
  write_json(result, args.out_dir and os.path.join(args.out_dir, out_name(modes)), module, argv)
  print(json.dumps(result))
  return result
