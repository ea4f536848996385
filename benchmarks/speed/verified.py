"""`--engine verify`: verified decoding of the shipped HAMburger-SmolLM2 against its base.

Held-out prompts (chat template), greedy, the model's EOS: the base (`Sampler(base=True)`) and
verified decoding (`Sampler(verify=True)`) decode the same prompts in batches of b, at each
drafting confidence (a draft is proposed while the stop head's continue-probability is >= it;
min_token_prob 0). Reported per prompt set, batch size and confidence: whether every answer is
the base's token for token, tokens per base forward, the acceptance of drafts 1..3 (given that
the drafts before were accepted), and decode tokens/s against the base (the loop alone, compile
excluded by a warm-up batch; the median of --repeats runs, settings in rotation).
"""

from __future__ import annotations

import statistics

from hamburger_jax.decode.checkpoint import open_checkpoint
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.recipes.heldout import heldout_prompts


def _batches(prompts, b):
  return [prompts[i:i + b] for i in range(0, len(prompts), b)]


def _run(sampler, prompts, b, max_new_tokens, **knobs):
  """-> (answers, forwards per row, decode seconds, draft counts [2, S-1] or None)."""
  answers, forwards, seconds, counts = [], [], 0.0, None
  for batch in _batches(prompts, b):
    r = sampler.decode(batch, max_new_tokens=max_new_tokens, **knobs)
    answers += r.tokens
    forwards += r.macro_steps
    seconds += r.decode_s
    if r.draft_counts is not None:
      counts = r.draft_counts if counts is None else [
          [x + y for x, y in zip(a, c)] for a, c in zip(counts, r.draft_counts)]
  return answers, forwards, seconds, counts


def _row(prompt_set, b, confidence, base, answers, forwards, seconds, counts, base_seconds):
  tokens = sum(len(a) for a in answers)
  reached, accepted = counts
  return {
      "prompt_set": prompt_set, "batch": b, "confidence": confidence,
      "same_as_base": answers == base, "tokens": tokens,
      "tokens_per_forward": tokens / max(sum(forwards), 1),
      "acceptance": [a / r if r else None for r, a in zip(reached, accepted)],
      "drafts_reached": reached, "drafts_accepted": accepted,
      "tokens_per_s": tokens / seconds,
      "base_tokens_per_s": sum(len(a) for a in base) / base_seconds,
      "speedup": base_seconds / seconds,
  }


def measure(args) -> dict:
  """The rows of every (prompt set, batch size, confidence)."""
  d = open_checkpoint("smollm2", verify=True)   # with its verification micro decoder, if any
  rows = []
  for prompt_set in args.prompt_sets.split(","):
    items = heldout_prompts(args.verify_prompts, prompt_set)
    prompts = [d.tokenizer.encode(x["prompt"], chat=True, system=d.system) for x in items]
    cache_length = -(-(max(len(p) for p in prompts) + args.max_new_tokens) // 64) * 64
    base = Sampler(d.config, d.params, base=True, cache_length=cache_length,
                   out_length=args.max_new_tokens, eos_ids=d.eos_ids)
    verify = Sampler(d.config, d.params, cache_length=cache_length,
                     out_length=args.max_new_tokens, eos_ids=d.eos_ids,
                     draft_vocab=d.draft_vocab, verify=True)
    confidences = [float(c) for c in args.draft_confidences.split(",")]
    for b in args.batch_sizes:
      settings = [("base", base, {})] + [
          (c, verify, dict(confidence=c, min_token_prob=0.0)) for c in confidences]
      for _, sampler, knobs in settings:                      # compile, then time
        sampler.decode(prompts[:b], max_new_tokens=args.max_new_tokens, **knobs)
      runs = {name: [] for name, _, _ in settings}
      for _ in range(args.repeats):
        for name, sampler, knobs in settings:
          runs[name].append(_run(sampler, prompts, b, args.max_new_tokens, **knobs))
      median = lambda name: statistics.median(r[2] for r in runs[name])
      base_answers = runs["base"][0][0]
      for c in confidences:
        answers, forwards, _, counts = runs[c][0]
        row = _row(prompt_set, b, c, base_answers, answers, forwards, median(c), counts,
                   median("base"))
        rows.append(row)
        print(format_table({"rows": [row]}).splitlines()[-1], flush=True)
  return {"max_new_tokens": args.max_new_tokens, "prompts": args.verify_prompts, "rows": rows}


def format_table(result: dict) -> str:
  from benchmarks.common import markdown_table  # pylint: disable=import-outside-toplevel
  fmt = lambda x: "-" if x is None else f"{x:.2f}"
  return markdown_table(
      ["prompts", "batch", "confidence", "same as base", "tokens/forward", "acceptance 1/2/3",
       "tokens/s", "base tokens/s", "vs base"],
      [[r["prompt_set"], r["batch"], r["confidence"], r["same_as_base"],
        f"{r['tokens_per_forward']:.2f}", "/".join(fmt(a) for a in r["acceptance"]),
        f"{r['tokens_per_s']:.1f}", f"{r['base_tokens_per_s']:.1f}", f"{r['speedup']:.2f}x"]
       for r in result["rows"]])
