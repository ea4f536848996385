r"""Where HAMburger's answers part from the base: the base's NLL of each generated token, by kind.

    python -m experiments.nll_by_token_kind --settings 0.35/0.8,0.05/0.6 --out nll_by_kind.json

Decodes the held-out prompts (hamburger_jax/recipes/heldout.py) one at a time (code fences on, as decode.py
and the server) and scores every generated token with the base reading the answer unmerged.
Each token is one of:
  first_step0      micro step 0 (the base's own next token) before any group of the answer was
                   merged: the base's reading is exact here;
  step0_after_merge  micro step 0 right after a merged input (a group of >= 2 tokens fed as one);
  step0_later      micro step 0 after a single-token input, with a merge earlier in the answer;
  draft            micro steps >= 1 (tokens the micro decoder drafted and the trust gate kept).
The table gives each kind's count, mean base NLL and share of the answers' total. The base's own
answers' mean NLL is the reference. The kinds sit at different places in the answers, so their
means are not a controlled comparison: step0_after_merge against step0_later is the closest one.
Writes the JSON with "provenance" to --out (default
docs/results/data/training/nll_by_token_kind.json).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from benchmarks.common import machine, markdown_table, results_dir, write_json
from hamburger_jax.recipes.heldout import PROMPT_SETS, heldout_prompts

KINDS = ("first_step0", "step0_after_merge", "step0_later", "draft")


def token_kinds(group_sizes) -> list[str]:
  """Group sizes of one answer, in order -> the kind of each of its tokens (see the docstring)."""
  kinds, merged, previous = [], False, 0
  for size in (s for s in group_sizes if s):
    for j in range(size):
      if j:
        kinds.append("draft")
      elif not merged:
        kinds.append("first_step0")
      else:
        kinds.append("step0_after_merge" if previous >= 2 else "step0_later")
    merged, previous = merged or size >= 2, size
  return kinds


def parse_settings(text: str) -> list[tuple[float, float]]:
  """"0.35/0.8,0.05/0.6" -> [(confidence, min_token_prob), ...]; else a one-line usage error."""
  out = []
  for item in text.split(","):
    conf, _, mtp = item.partition("/")
    try:
      pair = (float(conf), float(mtp))
    except ValueError:
      pair = (-1.0, -1.0)
    if not (0.0 <= pair[0] <= 1.0 and 0.0 <= pair[1] <= 1.0):
      raise argparse.ArgumentTypeError(
          f"{text!r}: settings are comma-separated CONFIDENCE/MIN_TOKEN_PROB pairs in [0, 1], "
          f"e.g. 0.35/0.8,0.05/0.6")
    out.append(pair)
  return out


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--settings", type=parse_settings,
                      default=parse_settings("0.35/0.8,0.05/0.6"))
  parser.add_argument("--num_prompts", type=int, default=24)
  parser.add_argument("--max_new_tokens", type=int, default=48)
  parser.add_argument("--prompt_set", default="both", choices=PROMPT_SETS)
  parser.add_argument("--asset_dir", default=None, help="default: the shipped asset")
  parser.add_argument("--out", default=os.path.join(results_dir("training"),
                                                    "nll_by_token_kind.json"),
                      help="the JSON ('' = print only)")
  return parser


def by_kind_rows(hamburger, scorer, prompts, conf, mtp, max_new_tokens, fences) -> list[dict]:
  """Decodes every prompt at one setting -> a row per kind (and "all"): tokens, mean base NLL,
  share of the answers' total NLL."""
  by_kind = {k: [] for k in KINDS}
  answers = [hamburger.decode([p], max_new_tokens=max_new_tokens, confidence=conf,
                              min_token_prob=mtp, fence_ids=fences) for p in prompts]
  for r, values in zip(answers, scorer.token_nll(prompts, [r.tokens[0] for r in answers])):
    for kind, value in zip(token_kinds(r.group_sizes[0]), values):
      by_kind[kind].append(float(value))
  total = sum(sum(v) for v in by_kind.values())
  count = sum(len(v) for v in by_kind.values())
  rows = [{"confidence": conf, "min_token_prob": mtp, "kind": kind, "tokens": len(values),
           "mean_nll": float(np.mean(values)) if values else None,
           "share_of_nll": sum(values) / total if total else 0.0}
          for kind, values in by_kind.items()]
  return rows + [{"confidence": conf, "min_token_prob": mtp, "kind": "all", "tokens": count,
                  "mean_nll": total / max(count, 1), "share_of_nll": 1.0}]


def main(argv=None):
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.num_prompts < 1 or args.max_new_tokens < 1:
    parser.error("--num_prompts and --max_new_tokens must be >= 1.")

  # pylint: disable=import-outside-toplevel
  from hamburger_jax.convert.errors import CheckpointError
  from hamburger_jax.decode import draft_vocab, evaluation
  from hamburger_jax.decode.sampler import Sampler
  from hamburger_jax.shipped import smollm2
  t0 = time.time()
  asset = args.asset_dir or smollm2.ASSET_DIR
  try:
    cfg, params, tok, base_cfg = smollm2.load_shipped(asset)
  except CheckpointError as e:
    parser.error(f"--asset_dir: {e}")
  prompts = [tok.encode(p["prompt"], chat=True, system=smollm2.SYSTEM_PROMPT)
             for p in heldout_prompts(args.num_prompts, args.prompt_set)]
  kw = dict(cache_length=max(map(len, prompts)) + args.max_new_tokens,
            out_length=args.max_new_tokens, min_prompt_bucket=16)
  hamburger = Sampler(cfg, params, draft_vocab=draft_vocab.resolve(None, asset,
                                                                   cfg.base.vocab_size), **kw)
  base = Sampler(cfg, params, base=True, **kw)
  scorer = evaluation.BaseScorer(base_cfg, params["base"])
  own = scorer.token_nll(prompts, [base.decode([p], max_new_tokens=args.max_new_tokens).tokens[0]
                                   for p in prompts])
  result = {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
            "asset_dir": asset, "base_own_nll": float(np.concatenate(own).mean()), "rows": []}
  for conf, mtp in args.settings:
    result["rows"] += by_kind_rows(hamburger, scorer, prompts, conf, mtp, args.max_new_tokens,
                                   tok.fence_ids())
  result["seconds"] = time.time() - t0
  result["machine"] = machine()
  write_json(result, args.out, __spec__.name, argv)
  cols = ["confidence", "min_token_prob", "kind", "tokens", "mean_nll", "share_of_nll"]
  fmt = lambda v: "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
  print(f"base's own answers: mean NLL {result['base_own_nll']:.3f}")
  print(markdown_table(cols, [[fmt(r[c]) for c in cols] for r in result["rows"]]))
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
