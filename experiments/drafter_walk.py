r"""Why verified decoding commits fewer tokens per forward than its drafter does teacher forced.

    python -m experiments.drafter_walk --prompts 24 --prompt_sets both,code

Teacher-forced acceptance averages over every position of an answer; greedy verified decoding
visits only the position after each forward's last committed token (`train/drafter.decode_walk`).
For the base's own greedy answers to held-out prompts (`recipes/heldout.py`, chat template,
--max_new_tokens) this reports, with the shipped verification drafter: the teacher-forced tokens
per forward (positions with all drafts inside the answer, as `drafter.acceptance` reports them;
and every position), the walk's tokens per forward on the same acceptance, and the decode loop's
own (`Sampler(verify=True)`, S - 1 drafts proposed every forward, S = --verify_steps). The
held-out distilled answers of the drafter's training (lines 9,750-9,999) give the first two figures
too when their cached features are there (--heldout_features DIR). Prints a table and its JSON;
writes the JSON with "provenance" to --out (default docs/results/data/training/drafter_walk.json).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from benchmarks.common import markdown_table, results_dir, write_json

HELDOUT_LINES = (9750, 10000)


def _row(name: str, cfg, params, ids, cache, decoded=None) -> dict:
  from hamburger_jax.train import drafter
  from hamburger_jax.train.drafter_features import with_steps
  data = drafter.prepare(with_steps(cache, cfg.max_steps), ids, cfg.base.vocab_size)
  acc = drafter.acceptance(cfg, params, ids, data)
  return {"answers": name, "positions": acc["positions"],
          "conditional_acceptance": acc["conditional_acceptance"],
          "teacher_forced": acc["tokens_per_forward"],
          "teacher_forced_every_position": acc["every_position"],
          "walk": acc["decoded_tokens_per_forward"], "decoded": decoded}


def measure(args) -> dict:
  from hamburger_jax.decode.checkpoint import open_checkpoint
  from hamburger_jax.decode.sampler import Sampler
  from hamburger_jax.recipes.heldout import heldout_prompts
  from hamburger_jax.train import drafter_features as dfe
  from hamburger_jax.decode.checkpoint import load_verify_drafter, verify_drafter_steps
  from hamburger_jax.decode.models import verify_depth
  from hamburger_jax.shipped.smollm2 import ASSET_DIR
  d = open_checkpoint("smollm2", verify=True)
  params = d.params
  if args.drafter:                  # a drafter recipe's WORKDIR instead of the shipped drafter
    params = load_verify_drafter(args.drafter, params)
  recorded = verify_drafter_steps(args.drafter or ASSET_DIR)      # the depth it was trained for
  steps = args.verify_steps or recorded or d.config.max_steps
  cfg, ids = d.config, np.asarray(d.draft_vocab)
  rows = []
  for prompt_set in args.prompt_sets.split(","):
    items = heldout_prompts(args.prompts, prompt_set)
    prompts = [d.tokenizer.encode(x["prompt"], chat=True, system=d.system) for x in items]
    cache_length = -(-(max(len(p) for p in prompts) + args.max_new_tokens) // 64) * 64
    kw = dict(cache_length=cache_length, out_length=args.max_new_tokens, eos_ids=d.eos_ids)
    base = Sampler(cfg, params, base=True, **kw)
    verify = Sampler(cfg, params, draft_vocab=d.draft_vocab, verify=True, verify_steps=steps,
                     **kw)
    answers, tokens, forwards = [], 0, 0
    for i in range(0, len(prompts), 8):
      batch = prompts[i:i + 8]
      answers += base.decode(batch, max_new_tokens=args.max_new_tokens).tokens
      r = verify.decode(batch, max_new_tokens=args.max_new_tokens, confidence=0.001,
                        min_token_prob=0.0)
      tokens, forwards = tokens + sum(len(t) for t in r.tokens), forwards + sum(r.macro_steps)
    cache = dfe.compute_features(cfg, params, list(zip(map(list, prompts), answers)),
                                 log_every=0)
    rows.append(_row(f"base's answers, {prompt_set}, {len(prompts)} prompts",
                     *verify_depth(cfg, params, steps), ids, cache, tokens / forwards))
  if args.heldout_features:
    from hamburger_jax.recipes.verify_drafter import cache_features
    cache = cache_features(cfg, params, args.heldout_features, HELDOUT_LINES)
    rows.append(_row("distilled answers 9,750-9,999", *verify_depth(cfg, params, steps), ids,
                     cache))
  return {"max_new_tokens": args.max_new_tokens, "verify_steps": steps,
          "drafter": args.drafter or "shipped", "rows": rows}


def format_table(result: dict) -> str:
  f = lambda x: "-" if x is None else f"{x:.3f}"
  return markdown_table(
      ["answers", "positions", "acceptance per draft", "teacher forced", "every position", "walk",
       "decoded"],
      [[r["answers"], r["positions"], "/".join(f"{a:.2f}" for a in r["conditional_acceptance"]),
        f(r["teacher_forced"]), f(r["teacher_forced_every_position"]), f(r["walk"]),
        f(r["decoded"])] for r in result["rows"]])


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--prompts", type=int, default=24)
  p.add_argument("--prompt_sets", default="both,code")
  p.add_argument("--max_new_tokens", type=int, default=48)
  p.add_argument("--verify_steps", type=int, default=0,
                 help="tokens per forward at most (0: the verification drafter's own depth)")
  p.add_argument("--drafter", default="",
                 help="a verify_drafter WORKDIR whose verify_drafter.safetensors to measure "
                      "(default: the shipped one)")
  p.add_argument("--heldout_features", default="",
                 help="the drafter recipe's held-out feature cache (WORKDIR/features/heldout)")
  p.add_argument("--out", default=os.path.join(results_dir("training"), "drafter_walk.json"))
  args = p.parse_args(argv)
  if args.prompts < 1 or args.max_new_tokens < 2:
    p.error("--prompts must be >= 1 and --max_new_tokens >= 2.")
  if args.verify_steps and not 2 <= args.verify_steps <= 16:
    p.error(f"--verify_steps must be 0 (the drafter's own) or in 2..16, got {args.verify_steps}.")
  result = write_json(measure(args), args.out, "experiments.drafter_walk", argv)
  print(format_table(result))


if __name__ == "__main__":
  main()
