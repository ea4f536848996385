"""`--engine verify`: verified decoding of the shipped HAMburger-SmolLM2 against its base.

Held-out prompts (chat template), greedy, the model's EOS: the base (`Sampler(base=True)`) and
verified decoding (`Sampler(verify=True)`) decode the same prompts in batches of b, at each
drafting confidence (a draft is proposed while the stop head's continue-probability is >= it;
min_token_prob 0). Reported per prompt set, batch size and confidence: whether every answer is
the base's token for token, tokens per base forward, the acceptance of drafts 1..3 (given that
the drafts before were accepted), and decode tokens/s against the base (the loop alone, compile
excluded by a warm-up batch; the median of --repeats runs, settings in rotation).

--verify_batching continuous: the same with continuous batching (`ContinuousBatcher`, b slots, all
the set's prompts submitted at once, a freed slot refilled at once, as a server runs): tokens/s end
to end (admissions included, for the base and verified decoding alike) and tokens per forward;
acceptance per draft is reported by the static rows only. Static batches of b rows decode until
their slowest row is done, so a row that drew fewer accepted drafts holds the batch.
--width_rules on,off: verified decoding with and without the width rule (`decode/draft_width.py`:
a step sends only the drafts worth its forward width's cost; on: by the checkpoint's calibrated
draft probabilities, else the stop head's estimates; costs: the CPU table, `draft_width.costs`).
--width_rules measured,off: the rule with its costs timed at start on this machine
(`Sampler(draft_width_costs="measure")`, `decode/width_costs.py`; with continuous batching
`ContinuousBatcher(draft_width_costs="measure")`, timed once when it is built).
--verify_steps 4,6: verified decoding at each depth (tokens a forward commits at most; default:
the verification drafter's own, `open_checkpoint(..).verify_steps`).
--draft_branches 1,2: verified decoding with one chain of drafts and with a draft tree of that many
chains (`decode/draft_tree.py`).
--drafter_quantize none,micro:int8: verified decoding with the drafter as stored and with the
drafter alone in int8 (`model/quantize.py`; the base, and so every answer, as stored).
--lookup_drafts 0,2: verified decoding without and with drafts looked up in the row's own tokens
where its last 2 or more repeat an earlier stretch (`decode/lookup_drafts.py`; default: the
engine's default).
--verify_temperature 0.7: the base and verified decoding both sample at that temperature (static
batches; same_as_base is then None: the answers agree in distribution, tests/decode/test_verify.py).
"""

from __future__ import annotations

import statistics

import time

from hamburger_jax.decode.batching import ContinuousBatcher, Request
from hamburger_jax.decode import lookup_drafts
from hamburger_jax.decode.checkpoint import open_checkpoint
from hamburger_jax.decode.compile_cache import next_pow2
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.model.quantize import apply_mode
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


def _rule_name(rule) -> str:
  """The width rule of a row (rule, costs): "off", "stop head" (its estimates) or "calibrated",
  with ", timed" when its costs were timed at start."""
  rule, costs = rule
  name = "off" if not rule else "stop head" if rule is True else "calibrated"
  return name + (", timed" if rule and costs == "measure" else "")


def _row(prompt_set, b, variant, base, answers, forwards, seconds, counts, base_seconds,
         batching="static", temperature=0.0, width_costs=None):
  confidence, rule, steps, branches, quantize, lookup = variant
  tokens = sum(len(a) for a in answers)
  reached, accepted = counts or ([None] * (steps - 1), [None] * (steps - 1))
  return {
      "prompt_set": prompt_set, "batching": batching, "batch": b, "confidence": confidence,
      "width_rule": _rule_name(rule), "verify_steps": steps, "draft_branches": branches,
      "drafter_quantize": quantize, "lookup_drafts": lookup, "temperature": temperature,
      "same_as_base": answers == base if temperature == 0.0 else None, "tokens": tokens,
      "tokens_per_forward": tokens / max(sum(forwards), 1),
      "acceptance": [a / r if r else None for r, a in zip(reached, accepted)],
      "drafts_reached": reached, "drafts_accepted": accepted,
      "tokens_per_s": tokens / seconds,
      "base_tokens_per_s": sum(len(a) for a in base) / base_seconds,
      "speedup": base_seconds / seconds,
      # the rule's costs per forward width when timed at start (`Sampler.measured_width_costs`)
      "width_costs": list(width_costs) if width_costs else None,
  }


def measure(args) -> dict:
  """The rows of every (prompt set, batching, batch size, confidence)."""
  d = open_checkpoint("smollm2", verify=True)   # with its verification micro decoder, if any
  rows = []
  for prompt_set in args.prompt_sets.split(","):
    items = heldout_prompts(args.verify_prompts, prompt_set)
    prompts = [d.tokenizer.encode(x["prompt"], chat=True, system=d.system) for x in items]
    cache_length = -(-(max(len(p) for p in prompts) + args.max_new_tokens) // 64) * 64
    for batching in args.verify_batching.split(","):
      measure_one = {"static": _static_rows, "continuous": _continuous_rows}[batching]
      for row in measure_one(args, d, prompts, cache_length, prompt_set):
        row["cpu_dots"] = args.cpu_dots
        rows.append(row)
        print(format_table({"rows": [row]}).splitlines()[-1], flush=True)
  return {"max_new_tokens": args.max_new_tokens, "prompts": args.verify_prompts, "rows": rows}


def _variants(args, d) -> list[tuple[float, bool, int, int, str, int]]:
  """(drafting confidence, width rule on, verify_steps, draft_branches, drafter quantize,
  lookup drafts' least match) of every verified setting."""
  on = True if d.draft_width_rule is None else d.draft_width_rule
  rules = {"on": (on, None), "measured": (on, "measure"), "off": (False, None)}
  depths = ([int(x) for x in args.verify_steps.split(",")] if args.verify_steps
            else [d.verify_steps or d.config.max_steps])
  lookups = lambda k: ([int(m) for m in args.lookup_drafts.split(",")] if args.lookup_drafts
                       else [lookup_drafts.resolve(None, True, k)])
  return [(float(c), rules[r], s, int(k), q, m) for c in args.draft_confidences.split(",")
          for r in args.width_rules.split(",") for s in depths
          for k in str(args.draft_branches).split(",")
          for q in args.drafter_quantize.split(",") for m in lookups(int(k))]


def _static_rows(args, d, prompts, cache_length, prompt_set) -> list[dict]:
  """`Sampler.decode` over consecutive batches of b prompts, base and verified in rotation."""
  base = Sampler(d.config, d.params, base=True, cache_length=cache_length,
                 out_length=args.max_new_tokens, eos_ids=d.eos_ids, cpu_dots=args.cpu_dots)
  verify = {(rule, steps, k, q, m): Sampler(d.config, apply_mode(d.params, d.config, q),
                                            cache_length=cache_length,
                                            out_length=args.max_new_tokens, eos_ids=d.eos_ids,
                                            draft_vocab=d.draft_vocab, verify=True,
                                            draft_width_rule=rule[0],
                                            draft_width_costs=rule[1], verify_steps=steps,
                                            draft_branches=k, lookup_drafts=m,
                                            cpu_dots=args.cpu_dots)
            for rule, steps, k, q, m in {v[1:] for v in _variants(args, d)}}
  rows, t = [], args.verify_temperature
  sampled = dict(temperature=t, seed=0) if t else {}
  for b in args.batch_sizes:
    settings = [("base", base, sampled)] + [
        (v, verify[v[1:]], dict(confidence=v[0], min_token_prob=0.0, **sampled))
        for v in _variants(args, d)]
    for _, sampler, knobs in settings:                      # compile, then time
      sampler.decode(prompts[:b], max_new_tokens=args.max_new_tokens, **knobs)
    runs = {name: [] for name, _, _ in settings}
    for _ in range(args.repeats):
      for name, sampler, knobs in settings:
        runs[name].append(_run(sampler, prompts, b, args.max_new_tokens, **knobs))
    median = lambda name: statistics.median(r[2] for r in runs[name])
    for v in _variants(args, d):
      answers, forwards, _, counts = runs[v][0]
      costs = verify[v[1:]].measured_width_costs.get(next_pow2(b))
      rows.append(_row(prompt_set, b, v, runs["base"][0][0], answers, forwards, median(v),
                       counts, median("base"), temperature=t, width_costs=costs))
  return rows


def _generate(batcher, prompts, max_new_tokens, confidence):
  """-> (answers, forwards per request, seconds): every prompt through the batcher."""
  requests = [Request(list(p), max_new_tokens=max_new_tokens, confidence=confidence,
                      min_token_prob=0.0) for p in prompts]
  start = time.perf_counter()
  done = batcher.generate(requests)
  seconds = time.perf_counter() - start
  return [c.tokens for c in done], [c.macro_steps for c in done], seconds


def _continuous_rows(args, d, prompts, cache_length, prompt_set) -> list[dict]:
  """`ContinuousBatcher` with b slots fed all prompts, base and verified in rotation."""
  rows = []
  for b in args.batch_sizes:
    kw = dict(num_slots=b, cache_length=cache_length, eos_ids=d.eos_ids,
              cpu_dots=args.cpu_dots)
    base = ContinuousBatcher(d.config, d.params, base=True, **kw)
    verify = {(rule, steps, k, q, m): ContinuousBatcher(
        d.config, apply_mode(d.params, d.config, q), draft_vocab=d.draft_vocab, verify=True,
        draft_width_rule=rule[0], draft_width_costs=rule[1], verify_steps=steps,
        draft_branches=k, lookup_drafts=m, **kw)
              for rule, steps, k, q, m in {v[1:] for v in _variants(args, d)}}
    settings = [("base", base, 1.0)] + [(v, verify[v[1:]], v[0]) for v in _variants(args, d)]
    for _, batcher, c in settings:                          # compile, then time
      _generate(batcher, prompts[:b + 1], args.max_new_tokens, c)
    runs = {name: [] for name, _, _ in settings}
    for _ in range(args.repeats):
      for name, batcher, c in settings:
        runs[name].append(_generate(batcher, prompts, args.max_new_tokens, c))
    median = lambda name: statistics.median(r[2] for r in runs[name])
    for v in _variants(args, d):
      answers, forwards, _ = runs[v][0]
      rows.append(_row(prompt_set, b, v, runs["base"][0][0], answers, forwards, median(v),
                       None, median("base"), batching="continuous",
                       width_costs=verify[v[1:]].measured_width_costs))
  return rows


def format_table(result: dict) -> str:
  from benchmarks.common import markdown_table  # pylint: disable=import-outside-toplevel
  fmt = lambda x: "-" if x is None else f"{x:.2f}"
  return markdown_table(
      ["prompts", "batching", "batch", "confidence", "width rule", "steps", "chains",
       "drafter", "lookup", "temperature", "CPU dots", "same as base",
       "tokens/forward", "acceptance per draft", "tokens/s", "base tokens/s", "vs base"],
      [[r["prompt_set"], r.get("batching", "static"), r["batch"], r["confidence"],
        r.get("width_rule") or "-", r.get("verify_steps", 4),
        r.get("draft_branches", 1), r.get("drafter_quantize", "none"),
        "-" if r.get("lookup_drafts") is None else r["lookup_drafts"], r.get("temperature", 0.0),
        r.get("cpu_dots", "ynnpack"), "-" if r["same_as_base"] is None else r["same_as_base"],
        f"{r['tokens_per_forward']:.2f}", "/".join(fmt(a) for a in r["acceptance"]),
        f"{r['tokens_per_s']:.1f}", f"{r['base_tokens_per_s']:.1f}", f"{r['speedup']:.2f}x"]
       for r in result["rows"]])
