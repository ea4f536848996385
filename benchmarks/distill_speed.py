"""Distillation speed: SmolLM2 base-mode batched greedy decoding, tokens/s by batch size.

    python -m benchmarks.distill_speed                         # batch 1, 8, 32 on 32 prompts
    python -m benchmarks.distill_speed --batch_sizes 32,64 --num_prompts 64
    python -m benchmarks.distill_speed --engines static,continuous --batch_sizes 16,32

Decodes like the recipe's distill step (hamburger_jax.recipes.smollm2.step_distill): the GGUF
base in float32, ChatML with SmolLM2's default system prompt, prefill buckets of powers of two
from 32 tokens, greedy, stopping at EOS or --max_new_tokens. The prompts are a balanced pick of
hamburger_jax.recipes.broad_prompts, sorted by token length (less padding). Engines: `static`
(a Sampler, batches of batch_size prompts) and `continuous` (a ContinuousBatcher with batch_size
slots, all prompts in one call: a finished row's slot takes the next prompt at once). Reported
per engine and batch size: answer tokens (EOS excluded), seconds of prefill and decode loop
(static; compile excluded, and reported apart), tokens/s over the run without compiles, and
(static) row efficiency: answer tokens / (rows x loop steps), the share of the batch's work that
was not spent on rows already finished. Writes --out (JSON with "provenance"; default
docs/results/data/training/distill_speed.json) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time

from benchmarks.common import markdown_table, positive_ints, results_dir, write_json
from hamburger_jax.data.distill import MIN_PROMPT_BUCKET
from hamburger_jax.recipes import broad_prompts
from hamburger_jax.shipped.smollm2 import SYSTEM_PROMPT, load_base, write_tokenizer


def encoded_prompts(tok, n: int, max_prompt_tokens: int) -> list[list[int]]:
  """n training prompts (kinds balanced, fixed seed) as ChatML token ids, shortest first."""
  train = [p for p in broad_prompts.broad_prompts() if p["split"] == "train"]
  chosen = broad_prompts.balanced(train, 4 * n, random.Random(0))
  ids = [tok.encode(p["prompt"], chat=True, system=SYSTEM_PROMPT) for p in chosen]
  return sorted([x for x in ids if len(x) <= max_prompt_tokens][:n], key=len)


def run_batch_size(sampler, prompts, batch_size: int, max_new_tokens: int, eos) -> dict:
  tokens = steps = rows = 0
  prefill_s = decode_s = compile_s = 0.0
  t0 = time.perf_counter()
  for i in range(0, len(prompts), batch_size):
    chunk = prompts[i:i + batch_size]
    result = sampler.decode(chunk, max_new_tokens=max_new_tokens)
    lengths = [len([t for t in ids if t not in eos]) for ids in result.tokens]
    tokens += sum(lengths)
    steps += result.iterations
    rows += len(chunk)
    prefill_s, decode_s = prefill_s + result.prefill_s, decode_s + result.decode_s
    compile_s += result.compile_s
  return {"engine": "static", "batch_size": batch_size, "prompts": rows,
          "batches": -(-rows // batch_size),
          "answer_tokens": tokens, "prefill_s": round(prefill_s, 2),
          "decode_s": round(decode_s, 2), "compile_s": round(compile_s, 2),
          "wall_s": round(time.perf_counter() - t0, 2),
          "tokens_per_s": round(tokens / (prefill_s + decode_s), 1),
          "row_efficiency": round(tokens / (steps * batch_size), 3)}


def run_continuous(cfg, params, prompts, num_slots: int, max_prompt_tokens: int,
                   max_new_tokens: int, eos) -> dict:
  from hamburger_jax.decode.batching import ContinuousBatcher, Request
  batcher = ContinuousBatcher(cfg, params, base=True, num_slots=num_slots,
                              cache_length=max_prompt_tokens + max_new_tokens,
                              eos_ids=tuple(eos),
                              min_prompt_bucket=min(MIN_PROMPT_BUCKET, max_prompt_tokens))
  t0 = time.perf_counter()
  done = batcher.generate([Request(prompt_ids=p, max_new_tokens=max_new_tokens) for p in prompts])
  wall = time.perf_counter() - t0
  tokens = sum(len([t for t in c.tokens if t not in eos]) for c in done)
  return {"engine": "continuous", "batch_size": num_slots, "prompts": len(prompts),
          "answer_tokens": tokens, "compile_s": round(batcher.compile_s, 2),
          "wall_s": round(wall, 2),
          "tokens_per_s": round(tokens / (wall - batcher.compile_s), 1)}


def _engines(text: str) -> list[str]:
  names = [n for n in text.split(",") if n]
  bad = [n for n in names if n not in ("static", "continuous")]
  if not names or bad:
    raise argparse.ArgumentTypeError(f"--engines takes static and/or continuous, got {text!r}")
  return names


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch_sizes", type=positive_ints, default="1,8,32")
  parser.add_argument("--engines", type=_engines, default="static")
  parser.add_argument("--num_prompts", type=int, default=32)
  parser.add_argument("--max_new_tokens", type=int, default=96)
  parser.add_argument("--max_prompt_tokens", type=int, default=128)
  parser.add_argument("--workdir", default=os.path.join(os.path.expanduser("~"), ".cache",
                                                        "hamburger_jax", "smollm2"),
                      help="where SmolLM2's tokenizer.json is (re)built")
  parser.add_argument("--out", default=os.path.join(results_dir("training"), "distill_speed.json"))
  parser.add_argument("--machine", default="", help="a note on the machine, kept in the JSON")
  return parser


def main(argv=None):
  parser = build_parser()
  args = parser.parse_args(argv)
  batch_sizes = args.batch_sizes
  if args.num_prompts < 1:
    parser.error("--num_prompts must be positive")

  import jax
  from hamburger_jax.text.tokenizer import Tokenizer
  from hamburger_jax.decode.sampler import Sampler
  os.makedirs(args.workdir, exist_ok=True)
  tok = Tokenizer(write_tokenizer(args.workdir))
  prompts = encoded_prompts(tok, args.num_prompts, args.max_prompt_tokens)
  cfg, params = load_base()
  sampler = Sampler(cfg, params, cache_length=args.max_prompt_tokens + args.max_new_tokens,
                    out_length=args.max_new_tokens,
                    min_prompt_bucket=min(MIN_PROMPT_BUCKET, args.max_prompt_tokens))
  eos = set(cfg.eos_token_ids)
  rows = []
  for b in batch_sizes:
    for engine in args.engines:
      if engine == "static":
        rows.append(run_batch_size(sampler, prompts, b, args.max_new_tokens, eos))
      else:
        rows.append(run_continuous(cfg, params, prompts, b, args.max_prompt_tokens,
                                   args.max_new_tokens, eos))
      print(json.dumps(rows[-1]), flush=True)
  report = {
      "benchmark": "distill_speed", "model": "SmolLM2-135M-Instruct (GGUF Q4_1 -> float32)",
      "max_new_tokens": args.max_new_tokens, "max_prompt_tokens": args.max_prompt_tokens,
      "prompt_tokens": [len(p) for p in prompts],
      "machine": {"note": args.machine, "backend": jax.default_backend(),
                  "cpu_count": os.cpu_count(), "platform": platform.platform(),
                  "processor": platform.processor(), "jax": jax.__version__,
                  "load_average_1_5_15min_at_end": os.getloadavg()},
      "results": rows}
  best = max(rows, key=lambda r: r["tokens_per_s"])
  report["best"] = {"engine": best["engine"], "batch_size": best["batch_size"]}
  write_json(report, args.out, __spec__.name, argv)
  keys = ("engine", "batch_size", "prompts", "answer_tokens", "prefill_s", "decode_s",
          "compile_s", "tokens_per_s", "row_efficiency")
  print("\n" + markdown_table(keys, [[r.get(k, "-") for k in keys] for r in rows]))
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
