r"""Speed-quality benchmark of the shipped HAMburger-SmolLM2 against its base, in one run.

    python -m benchmarks.quality                                  # full (64 held-out prompts)
    python -m benchmarks.quality --num_prompts 4 --max_new_tokens 16 --out_dir /tmp/q  # quick
    python -m benchmarks.quality --confidences 0.7,0.8 --min_token_probs 0,0.3,0.5  # trust sweep
    python -m benchmarks.quality --quantize int8 --num_prompts 32 --max_new_tokens 48   # int8
    python -m benchmarks.quality --quantize int8,int8:192,int8:64,bf16 --num_prompts 32 \
        --max_new_tokens 48                     # weight formats side by side

Speed is measured one prompt at a time by default (single-request latency, as in the paper);
`--batch_size 0` decodes all prompts as one batch, where every macro step pays for the longest
group of any row.

Held-out prompts are never used in training (hamburger_jax/recipes/heldout.py): standard-library
functions (split by function) and the broad recipe prompts (split by item); `--prompt_set` picks
one or both, or "code": the held-out standard-library "write a function" prompts alone. Code
answers are scored for parsing and for defining the function the prompt names. Writes
quality.json, quality.md and quality.png to --out_dir (default docs/results/data/quality/).
"""

import argparse
import json
import os
import time

from benchmarks.common import check_flag_groups, machine, results_dir, write_json
from benchmarks.speed import quantized
from hamburger_jax.decode import draft_vocab, evaluation
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.model import quantize
from hamburger_jax.shipped import smollm2
from hamburger_jax.recipes.heldout import PROMPT_SETS, heldout_prompts


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--num_prompts", type=int, default=64)
  parser.add_argument("--max_new_tokens", type=int, default=96)
  parser.add_argument("--confidences", default="0.5,0.6,0.7,0.8,0.9,1.0")
  parser.add_argument("--min_token_probs", default="0",
                      help="decode-time trust thresholds swept with every confidence, e.g. 0,0.3,0.5")
  parser.add_argument("--prompt_set", default="both", choices=PROMPT_SETS,
                      help="held-out prompts: standard-library functions, broad recipe prompts, "
                           "both, or code (the standard-library 'write a function' ones)")
  parser.add_argument("--paired", type=int, default=1,
                      help="1: time the base again beside every setting, prompt by prompt "
                           "interleaved (speed-ups robust to a changing load); 0: once")
  parser.add_argument("--asset_dir", default=smollm2.ASSET_DIR)
  parser.add_argument("--draft_vocab", default=None,
                      help="what HAMburger's drafts choose from: 'full' (the whole vocabulary) or a "
                           "draft vocabulary file (decode/draft_vocab.py); default: the asset's "
                           "draft_vocab.json if it has one")
  parser.add_argument("--code_fences", type=int, default=1,
                      help="1: fenced code decodes one token per macro step (the decode.py and "
                           "server default); 0: HAMburger merges inside code too")
  parser.add_argument("--out_dir", default=results_dir("quality"),
                      help="where quality.json, .md and .png go ('' = print only)")
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--batch_size", type=int, default=1,
                      help="prompts per decode call; 1 = single-request latency (0 = all at once)")
  parser.add_argument("--quantize", default="none",
                      help="int8: the base with int8 weights against float32 instead "
                           "(benchmarks/speed/quantized.py; writes quantized.json); a list such "
                           "as int8,int8:64,bf16 measures each (int8:G: a scale per group of G "
                           "inputs; bf16: weights rounded to bfloat16; kv-int8: float32 "
                           "weights, int8 KV buffers) in one run and writes "
                           "quantized_groups.json (quantized_kv.json with kv-int8)")
  return parser


# Flags of the speed-quality measurement alone: refused with --quantize.
SPEED_QUALITY_FLAGS = ("confidences", "min_token_probs", "paired", "draft_vocab", "code_fences",
                       "repeats")


def write_outputs(result: dict, table: str, out_dir: str) -> None:
  """quality.json, quality.md and quality.png in out_dir (none when out_dir is empty)."""
  write_json(result, out_dir and os.path.join(out_dir, "quality.json"), __spec__.name)
  if not out_dir:
    return
  with open(os.path.join(out_dir, "quality.md"), "w") as f:
    f.write(table + "\n")
  evaluation.plot(result, os.path.join(out_dir, "quality.png"))


def main(argv=None):
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.batch_size < 0:
    parser.error(f"--batch_size must be >= 0 (0 = all prompts at once), got {args.batch_size}.")
  if args.quantize != "none":
    defaults = {name: parser.get_default(name) for name in SPEED_QUALITY_FLAGS}
    check_flag_groups(parser, args, {"speed-quality": defaults}, "quantized")
    args.batch_size = args.batch_size or args.num_prompts
    try:
      quantized.parse_modes(args.quantize)
    except ValueError as e:
      parser.error(str(e))
    try:
      return quantized.run(args, __spec__.name, argv)
    except quantize.QuantizeError as e:         # a group size the model's widths refuse
      parser.error(str(e))

  t0 = time.time()
  try:
    draft_vocab.check_exists(args.draft_vocab)
  except draft_vocab.DraftVocabError as e:
    parser.error(f"--draft_vocab: {e}")
  cfg, params, tok, base_cfg = smollm2.load_shipped(args.asset_dir)
  items = heldout_prompts(args.num_prompts, args.prompt_set)
  prompts = [tok.encode(p["prompt"], chat=True, system=smollm2.SYSTEM_PROMPT) for p in items]
  cache = max(len(p) for p in prompts) + args.max_new_tokens
  kw = dict(cache_length=cache, out_length=args.max_new_tokens, min_prompt_bucket=16)
  try:
    draft_ids = draft_vocab.resolve(args.draft_vocab, args.asset_dir, cfg.base.vocab_size)
  except draft_vocab.DraftVocabError as e:
    parser.error(f"--draft_vocab: {e}")
  hamburger = Sampler(cfg, params, draft_vocab=draft_ids, **kw)
  base = Sampler(cfg, params, base=True, **kw)
  scorer = evaluation.BaseScorer(base_cfg, params["base"])
  result = evaluation.measure(
      hamburger, base, scorer, prompts, [float(c) for c in args.confidences.split(",")],
      args.max_new_tokens, decode_text=tok.decode,
      code_prompt=[p["code"] for p in items], repeats=args.repeats,
      required_names=[evaluation.required_name(p["prompt"]) if p["code"] else None for p in items],
      paired=bool(args.paired),
      fence_ids=tok.fence_ids() if args.code_fences else (),
      batch_size=args.batch_size or None,
      min_token_probs=[float(m) for m in args.min_token_probs.split(",")])
  result["seconds"] = time.time() - t0
  result["draft_vocab"] = None if draft_ids is None else {
      "path": args.draft_vocab or os.path.join(args.asset_dir, draft_vocab.FILE_NAME),
      "size": len(draft_ids)}
  result["machine"] = machine()
  table = evaluation.format_table(result)
  print(table)
  write_outputs(result, table, args.out_dir)
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
