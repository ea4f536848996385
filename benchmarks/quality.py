r"""Speed-quality benchmark of the shipped HAMburger-SmolLM2 against its base, in one run.

    python benchmarks/quality.py --out_dir benchmarks/results            # full (64 held-out prompts)
    python benchmarks/quality.py --num_prompts 4 --max_new_tokens 16     # quick
    python benchmarks/quality.py --confidences 0.7,0.8 --min_token_probs 0,0.3,0.5  # trust sweep

Speed is measured one prompt at a time by default (single-request latency, as in the paper);
`--batch_size 0` decodes all prompts as one batch, where every macro step pays for the longest
group of any row.

Held-out prompts are never used in training: standard-library functions (split by function,
hamburger_jax/recipes/stdlib_prompts.py) and the broad recipe prompts (split by item,
hamburger_jax/recipes/broad_prompts.py); `--prompt_set` picks one or both, or "code": the held-out
standard-library "write a function" prompts alone. Code answers are scored for parsing and for
defining the function the prompt names. Writes quality.json, quality.md and quality.png.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report import machine  # noqa: E402  pylint: disable=import-error

from hamburger_jax.decode import draft_vocab, evaluation  # noqa: E402
from hamburger_jax.recipes import smollm2  # noqa: E402
from hamburger_jax.recipes.broad_prompts import broad_prompts  # noqa: E402
from hamburger_jax.recipes.stdlib_prompts import stdlib_prompts  # noqa: E402
from hamburger_jax.decode.sampler import Sampler  # noqa: E402


def heldout_prompts(n: int, prompt_set: str = "both"):
  """n held-out prompts (never distilled or trained on), kinds interleaved so a small n has all.

  prompt_set: "stdlib" (standard-library functions held out by function), "broad" (the broad
  recipe prompts held out by item), "both", or "code" (the held-out standard-library prompts
  that ask for a named function). Each -> {"prompt", "kind", "code"}.
  """
  by_kind = {}
  if prompt_set in ("stdlib", "both", "code"):
    for p in stdlib_prompts():
      if p["split"] == "heldout" and (prompt_set != "code" or p["kind"] == "write"):
        by_kind.setdefault("stdlib:" + p["kind"], []).append(
            {"prompt": p["prompt"], "kind": p["kind"], "code": p["kind"] == "write"})
  if prompt_set in ("broad", "both"):
    for p in broad_prompts():
      if p["split"] == "heldout":
        by_kind.setdefault("broad:" + p["kind"], []).append(
            {"prompt": p["prompt"], "kind": p["kind"], "code": False})
  if not by_kind:
    raise ValueError(f"--prompt_set must be stdlib, broad, both or code, got {prompt_set!r}.")
  out = []
  while len(out) < n and any(by_kind.values()):
    for kind in sorted(by_kind):
      if by_kind[kind] and len(out) < n:
        out.append(by_kind[kind].pop(0))
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--num_prompts", type=int, default=64)
  parser.add_argument("--max_new_tokens", type=int, default=96)
  parser.add_argument("--confidences", default="0.5,0.6,0.7,0.8,0.9,1.0")
  parser.add_argument("--min_token_probs", default="0",
                      help="decode-time trust thresholds swept with every confidence, e.g. 0,0.3,0.5")
  parser.add_argument("--prompt_set", default="both", choices=["stdlib", "broad", "both", "code"],
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
  parser.add_argument("--out_dir", default="")
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--batch_size", type=int, default=1,
                      help="prompts per decode call; 1 = single-request latency (0 = all at once)")
  args = parser.parse_args(argv)
  if args.batch_size < 0:
    parser.error(f"--batch_size must be >= 0 (0 = all prompts at once), got {args.batch_size}.")

  t0 = time.time()
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
  print(json.dumps(result))
  if args.out_dir:
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "quality.json"), "w") as f:
      json.dump(result, f, indent=2)
    with open(os.path.join(args.out_dir, "quality.md"), "w") as f:
      f.write(table + "\n")
    evaluation.plot(result, os.path.join(args.out_dir, "quality.png"))
  return result


if __name__ == "__main__":
  main()
