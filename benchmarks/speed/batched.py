"""`--engine batch` / `continuous`: batched decode speed of the shipped HAMburger-SmolLM2 vs its
base, static vs continuous batching, per micro-step policy, with the quality cost of policies that
cut groups.

Prompts: held-out prompts (chat template), greedy, no EOS (every answer has exactly
--max_new_tokens tokens, so every setting decodes the same number of tokens); HAMburger decodes
with the checkpoint's recommended confidence / min_token_prob unless they are given. With
--length_spread S (continuous only) request i decodes its own length, --max_new_tokens x
(1 + u_i), u_i uniform in [-S, S] with a fixed seed, the same for every model: rows then finish
at different macro steps for the base too, as in a server (with one length for all, the base's
rows finish together and refill in waves).
Static batching (`batch`): `Sampler.decode` over consecutive batches of b prompts. Continuous
batching: `ContinuousBatcher` with b slots fed all prompts. Reported per setting: tokens/s end to
end (prefill + decode wall time, compile excluded by a warm-up pass), static decode-only tokens/s
(the loop alone), tokens per macro step, and quality against the base's greedy answers (token
agreement, base-model NLL of the answers). Component costs at each batch size: one base forward,
the heads (LM head + stop head) and one micro step without them. HAMburger runs with the
engines' default, micro-step compaction off; --compare_compact 1 adds the same settings with it
on (the micro prefill and micro steps on the continuing rows only, gathered into a power-of-two
or full row bucket; the `compact` column). Every setting is timed --repeats times, the settings
in rotation, and the median wall time is reported.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import machine
from hamburger_jax.decode import compaction, draft_vocab, evaluation
from hamburger_jax.decode.batching import ContinuousBatcher, Request
from hamburger_jax.decode.models import decode_model
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.model.kv_cache import init_cache
from hamburger_jax.shipped import smollm2
from hamburger_jax.recipes.heldout import heldout_prompts

ENGINE_NAMES = {"batch": "static", "continuous": "continuous"}    # --engine -> the JSON's name


def component_ms(cfg, params, batch_sizes, cache_length, repeats=20):
  """Milliseconds of one base forward (one input per row) and one micro step, per batch size."""
  model, _ = decode_model(cfg, params)
  llama = model.llama
  out = {}
  for b in batch_sizes:
    cache = init_cache(llama, llama.num_layers, b, cache_length)
    groups = jnp.ones((b, 1, cfg.max_steps), jnp.int32)
    ones = jnp.ones((b, 1), jnp.int32)
    fwd = jax.jit(lambda p, c: model.forward(p, groups, ones, ones * 40, c, ones[:, 0] * 40))
    feats, _ = fwd(params, cache)
    micro = model.micro_prefill(params, feats[:, 0])
    step = jax.jit(lambda p, m: model.micro_step(p, ones[:, 0], jnp.int32(1), m))
    heads = jax.jit(model.heads)
    out[b] = {"base_forward_ms": _time(fwd, params, cache, repeats=repeats),
              "heads_ms": _time(heads, params, feats[:, 0, -1], repeats=repeats),
              "micro_step_ms": _time(step, params, micro, repeats=repeats)}
  return out


def _time(fn, *args, repeats):
  jax.block_until_ready(fn(*args))
  t0 = time.perf_counter()
  for _ in range(repeats):
    r = fn(*args)
  jax.block_until_ready(r)
  return (time.perf_counter() - t0) / repeats * 1e3


def run_static(sampler, prompts, b, n, **knobs):
  """-> (token lists, macro steps, wall s, decode-only s); a 1-token pass compiles first."""
  chunks = [prompts[i:i + b] for i in range(0, len(prompts), b)]
  for c in {(len(c), sampler.prompt_bucket(c)): c for c in chunks}.values():   # each shape once
    sampler.decode(c, max_new_tokens=1, eos_ids=[], **knobs)
  t0 = time.perf_counter()
  runs = [sampler.decode(c, max_new_tokens=n, eos_ids=[], **knobs) for c in chunks]
  wall = time.perf_counter() - t0
  return ([t for r in runs for t in r.tokens], [m for r in runs for m in r.macro_steps], wall,
          sum(r.decode_s for r in runs))


def request_lengths(num, n, spread, seed=0):
  """max_new_tokens of `num` requests: all n (spread 0), else drawn uniformly from
  [n (1 - spread), n (1 + spread)] with a fixed seed (the same for every model and engine)."""
  if not spread:
    return [n] * num
  u = np.random.default_rng(seed).uniform(-spread, spread, num)
  return [max(1, int(round(n * (1 + x)))) for x in u]


def run_continuous(batcher, prompts, lengths, confidence, min_token_prob=0.0, fence_ids=()):
  """lengths: max_new_tokens per prompt -> (token lists, macro steps, wall s, None); a 1-token
  pass compiles first."""
  buckets = {batcher.prompt_bucket(len(p)): p for p in prompts}             # each bucket once
  knobs = dict(confidence=confidence, min_token_prob=min_token_prob, fence_ids=tuple(fence_ids))
  batcher.generate([Request(p, 1, **knobs) for p in buckets.values()])
  t0 = time.perf_counter()
  done = batcher.generate([Request(p, m, **knobs) for p, m in zip(prompts, lengths)])
  wall = time.perf_counter() - t0
  return [c.tokens for c in done], [c.macro_steps for c in done], wall, None


def row(batch, engine, model, policy, run, prompts, base_tokens, scorer, compact=None):
  tokens, steps, wall, decode_s = run
  total = sum(len(t) for t in tokens)
  agree = [evaluation.agreement(h, b)[0] for h, b in zip(tokens, base_tokens)]
  return {"batch": batch, "engine": engine, "model": model, "policy": policy,
          "compact_micro_steps": compact,
          "requests": len(tokens), "tokens": total, "wall_s": wall,
          "tokens_per_s": total / wall,
          "decode_only_tokens_per_s": None if decode_s is None else total / decode_s,
          "tokens_per_step": total / max(sum(steps), 1),
          "token_agreement": float(np.mean(agree)),
          "base_nll": scorer.mean_nll(prompts, tokens)}


def settings_of(b, cfg, params, prompts, lengths, args, drafts, fence_ids):
  """-> [(meta, fn)]: the base and every HAMburger setting (compaction x draft vocabulary x
  policy) on both engines; fn() decodes all prompts once -> (tokens, steps, wall s, decode s)."""
  n, conf, trust = args.max_new_tokens, args.confidence, args.min_token_prob
  cache = max(len(p) for p in prompts) + max(lengths) + 1
  kw = dict(cache_length=cache, out_length=n, cpu_dots=args.cpu_dots)
  ckw = dict(num_slots=b, cache_length=cache, chunk_steps=args.chunk_steps, eos_ids=(-1,),
             cpu_dots=args.cpu_dots)
  base_s = Sampler(cfg, params, base=True, **kw)
  base_c = ContinuousBatcher(cfg, params, base=True, **ckw)
  settings = [(dict(engine="static", model="base", policy=None),
               lambda: run_static(base_s, prompts, b, n)),
              (dict(engine="continuous", model="base", policy=None),
               lambda: run_continuous(base_c, prompts, lengths, 1.0))]
  compacts = [False] + ([True] if args.compare_compact and b >= 4 else [])
  for compact, draft_ids in itertools.product(compacts, drafts):
    ham_s = Sampler(cfg, params, compact_micro_steps=compact, draft_vocab=draft_ids, **kw)
    ham_c = ContinuousBatcher(cfg, params, compact_micro_steps=compact, draft_vocab=draft_ids,
                              **ckw)
    shown = compaction.micro_buckets(ham_s.engine, b) != (b,)
    draft_size = cfg.base.vocab_size if draft_ids is None else len(draft_ids)
    for policy in args.policies.split(","):
      if b == 1 and policy != "all":
        continue                     # one row: every policy is "all"
      meta = dict(model="hamburger", policy=policy, compact=shown, draft_vocab=draft_size)

      def continuous(batcher=ham_c, policy=policy):
        batcher.set_micro_policy(policy)
        return run_continuous(batcher, prompts, lengths, conf, trust, fence_ids)

      settings += [(dict(engine="static", **meta),
                    functools.partial(run_static, ham_s, prompts, b, n, confidence=conf,
                                      min_token_prob=trust, micro_policy=policy,
                                      fence_ids=tuple(fence_ids))),
                   (dict(engine="continuous", **meta), continuous)]
  engines = [ENGINE_NAMES[e] for e in args.engine]
  return [(meta, fn) for meta, fn in settings if meta["engine"] in engines]


def bench_batch(b, cfg, params, prompts, args, scorer, drafts=(None,), fence_ids=()):
  """All settings at one batch size -> rows. Every setting runs `args.repeats` times, the
  settings in rotation (a slow phase of a shared machine hits them alike); its wall time is the
  median (greedy: every repeat gives the same tokens, checked). drafts: what HAMburger's drafts
  choose from, one entry per run of its settings (token ids, or None for the whole vocabulary).
  fence_ids: HAMburger's code-fence ids (() = merge inside code too)."""
  lengths = request_lengths(len(prompts), args.max_new_tokens, args.length_spread)
  settings = settings_of(b, cfg, params, prompts, lengths, args, drafts, fence_ids)
  runs = [[] for _ in settings]
  for _ in range(args.repeats):
    for i, (_, fn) in enumerate(settings):
      runs[i].append(fn())
  rows, base_tokens = [], runs[0][0][0]          # the base's greedy answers (either engine)
  for (meta, _), reps in zip(settings, runs):
    assert all(r[0] == reps[0][0] for r in reps), f"repeats of {meta} gave different tokens"
    median = lambda i: None if reps[0][i] is None else float(np.median([r[i] for r in reps]))
    run = (reps[0][0], reps[0][1], median(2), median(3))
    rows.append(row(b, meta["engine"], meta["model"], meta["policy"], run, prompts, base_tokens,
                    scorer, meta.get("compact")))
    rows[-1]["draft_vocab"] = meta.get("draft_vocab")
    rows[-1]["wall_s_repeats"] = [r[2] for r in reps]
    print(json.dumps(rows[-1]), flush=True)
  for r in rows:
    ref = next(x for x in rows if x["model"] == "base" and x["engine"] == r["engine"])
    r["vs_base"] = r["tokens_per_s"] / ref["tokens_per_s"]
  return rows


def format_table(result) -> str:
  cols = ["batch", "engine", "model", "policy", "compact_micro_steps", "draft_vocab", "requests",
          "tokens_per_s", "vs_base",
          "decode_only_tokens_per_s", "tokens_per_step", "token_agreement", "base_nll"]
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for r in result["rows"]:
    cells = ["-" if r.get(c) is None else f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c])
             for c in cols]
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("")
  lines.append("| batch | base forward ms | heads ms | micro step ms (no heads) |")
  lines.append("|---|---|---|---|")
  for b, c in result["components"].items():
    lines.append(f"| {b} | {c['base_forward_ms']:.2f} | {c.get('heads_ms', float('nan')):.2f} "
                 f"| {c['micro_step_ms']:.2f} |")
  return "\n".join(lines)


def load(args):
  """-> (cfg, params on the device, tokenizer, base config, drafts: ids or None per
  --draft_vocabs entry). Raises draft_vocab.DraftVocabError."""
  names = args.draft_vocabs.split(",")
  for name in names:
    draft_vocab.check_exists(None if name == "shipped" else name)
  cfg, params, tok, base_cfg = smollm2.load_shipped(args.asset_dir)
  drafts = [draft_vocab.resolve(None if name == "shipped" else name, args.asset_dir,
                                cfg.base.vocab_size) for name in names]
  return cfg, jax.device_put(params), tok, base_cfg, drafts   # one copy, shared by every engine


def measure(args, loaded, write) -> dict:
  """The whole run over args.batch_sizes; write(result) after every batch size -> result."""
  t0 = time.time()
  load_before = os.getloadavg()
  cfg, params, tok, base_cfg, drafts = loaded
  items = heldout_prompts(max(args.num_prompts, args.batch1_prompts))
  all_prompts = [tok.encode(p["prompt"], chat=True, system=smollm2.SYSTEM_PROMPT) for p in items]
  scorer = evaluation.BaseScorer(base_cfg, params["base"])
  cache = max(len(p) for p in all_prompts) + max(
      request_lengths(len(all_prompts), args.max_new_tokens, args.length_spread)) + 1
  result = {
      "rows": [], "components": component_ms(cfg, params, args.batch_sizes, cache),
      "max_new_tokens": args.max_new_tokens, "length_spread": args.length_spread,
      "confidence": args.confidence,
      "min_token_prob": args.min_token_prob,
      "chunk_steps": args.chunk_steps, "repeats": args.repeats, "cpu_dots": args.cpu_dots,
      "code_fences": bool(args.code_fences),
      "prompts": "held-out prompts (standard library and broad), chat template",
      "device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
      "machine": machine() + ", shared",
      "load_average_before": load_before}
  for b in args.batch_sizes:                  # the JSON is rewritten after every batch size
    prompts = all_prompts[:args.batch1_prompts if b == 1 else args.num_prompts]
    result["rows"] += bench_batch(b, cfg, params, prompts, args, scorer, drafts,
                                  tok.fence_ids() if args.code_fences else ())
    result.update(load_average_after=os.getloadavg(), seconds=time.time() - t0)
    write(result)
  return result
