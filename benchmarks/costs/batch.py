"""`--what batch`: what one micro step costs at a batch of B rows when only some rows continue
their group, with and without micro-step compaction (shipped HAMburger-SmolLM2).

For each batch size B and each number k of continuing rows (the compaction buckets: the powers
of two below B, and B): the micro prefill plus one micro step with its heads, as the decode loop
runs them (`compaction.micro_prefill_rows`, `loop._micro_step_rows`), on all B rows (compaction off)
and on the k rows gathered (on); beside them one base forward plus heads at B rows (the rest of
a macro step); with --draft_vocab, the compacted micro step drafting from those ids. Settings are
timed in rotation, `--repeats` rounds, and the median is reported, so a slow phase of a shared
machine hits every setting alike.
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import machine
from hamburger_jax.decode import compaction, draft_vocab
from hamburger_jax.decode import loop as lp
from hamburger_jax.decode import state as ds
from hamburger_jax.decode.models import decode_model
from hamburger_jax.decode.sampling import SamplingParams
from hamburger_jax.model.kv_cache import init_cache
from hamburger_jax.shipped import smollm2


def micro_fn(engine, rows: int):
  """jitted (params, features [B, F, D], active [B]) -> one micro prefill + micro step on `rows`
  gathered rows (rows == B: every row), as the loop runs them."""
  def run(params, features, active):
    b = features.shape[0]
    knobs = ds.DecodeKnobs.make(b, confidence=0.0, min_token_prob=0.0, max_new_tokens=1 << 20,
                                max_group=engine.max_steps, eos_ids=(-1,),
                                sampling=SamplingParams.greedy())
    keys = jnp.zeros((b, 2), jnp.uint32)
    cache = compaction.micro_prefill_rows(engine, params, features, active, rows)
    group = lp.Group.first(lp.Pick(*(jnp.zeros((b,), t) for t in (
        jnp.int32, jnp.float32, jnp.float32, jnp.float32, bool, bool, bool, bool))),
        engine.max_steps)
    carry = lp.MicroCarry(jnp.int32(1), active, jnp.ones((b,), jnp.int32), cache, group)
    pick, _ = lp._micro_step_rows(  # pylint: disable=protected-access
        engine, params, carry, keys, knobs, knobs.max_new_tokens, rows)
    return pick.token
  return jax.jit(run)


def macro_fn(model, b: int, cache_length: int):
  """jitted params -> one base forward (groups of 2 tokens) plus heads at b rows."""
  llama = model.llama
  cache = init_cache(llama, llama.num_layers, b, cache_length)
  groups = jnp.ones((b, 1, model.max_steps), jnp.int32)
  ones = jnp.ones((b, 1), jnp.int32)

  def run(params):
    feats, _ = model.forward(params, groups, ones * 2, ones * 40, cache, ones[:, 0] * 40)
    logits, stop = model.heads(params, feats[:, 0, -1])
    return logits.sum() + stop.sum(), feats[:, 0]
  return jax.jit(run)


def timed_rounds(fns: dict, repeats: int) -> dict:
  """name -> (fn, args): median milliseconds per call, settings timed in rotation."""
  for fn, args in fns.values():
    jax.block_until_ready(fn(*args))                       # compile
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, (fn, args) in fns.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append((time.perf_counter() - t0) * 1e3)
  return {name: float(np.median(t)) for name, t in times.items()}


def _settings(cfg, full_params, b: int, cache_length: int, draft_ids):
  """-> (compaction buckets, name -> (jitted fn, args)) of one batch size."""
  model, params = decode_model(cfg, full_params)
  engine = lp.DecodeEngine(model, cache_length, cache_length, compact_micro_steps=True)
  buckets = compaction.micro_buckets(engine, b)
  macro = macro_fn(model, b, cache_length)
  _, features = macro(params)
  fns = {("macro", b): (macro, (params,))}
  if draft_ids is not None:
    draft_model, draft_params = decode_model(cfg, full_params, draft_vocab=draft_ids)
    draft_engine = lp.DecodeEngine(draft_model, cache_length, cache_length,
                                   compact_micro_steps=True)
  for k in buckets:
    active = jnp.arange(b) < k
    fns[("off", k)] = (micro_fn(engine, b), (params, features, active))
    if k < b:
      fns[("on", k)] = (micro_fn(engine, k), (params, features, active))
    if draft_ids is not None:
      fns[("draft", k)] = (micro_fn(draft_engine, k), (draft_params, features, active))
  return buckets, fns


def bench(cfg, params, b: int, repeats: int, cache_length: int, draft_ids=None) -> list[dict]:
  """draft_ids: also time the compacted micro step drafting from these token ids."""
  buckets, fns = _settings(cfg, params, b, cache_length, draft_ids)
  ms = timed_rounds(fns, repeats)
  macro_ms = ms[("macro", b)]
  rows = []
  for k in buckets:
    off, on = ms[("off", k)], ms.get(("on", k), ms[("off", k)])
    rows.append({"batch": b, "continuing_rows": k, "macro_step_ms": macro_ms,
                 "micro_ms_compaction_off": off, "micro_ms_compaction_on": on,
                 "on_vs_off": on / off, "micro_vs_macro_off": off / macro_ms,
                 "micro_vs_macro_on": on / macro_ms})
    if draft_ids is not None:
      rows[-1].update(micro_ms_draft_vocab=ms[("draft", k)],
                      draft_vs_on=ms[("draft", k)] / on, draft_vocab=len(draft_ids))
  return rows


def format_table(rows) -> str:
  lines = ["| batch B | continuing rows k | base forward + heads ms | micro prefill + step ms, "
           "all B rows | on k rows (compacted) | compacted / all |", "|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['batch']} | {r['continuing_rows']} | {r['macro_step_ms']:.1f} | "
                 f"{r['micro_ms_compaction_off']:.1f} | {r['micro_ms_compaction_on']:.1f} | "
                 f"{r['on_vs_off']:.2f} |")
  if rows and "micro_ms_draft_vocab" in rows[0]:
    lines += ["", f"| batch B | continuing rows k | compacted ms | drafting from "
                  f"{rows[0]['draft_vocab']} ids ms | ratio |", "|---|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['continuing_rows']} | {r['micro_ms_compaction_on']:.1f} | "
              f"{r['micro_ms_draft_vocab']:.1f} | {r['draft_vs_on']:.2f} |" for r in rows]
  return "\n".join(lines)


def load(args):
  """-> (cfg, params on the device, draft ids or None). Raises draft_vocab.DraftVocabError."""
  draft_vocab.check_exists(args.draft_vocab or None)
  cfg, params, _, _ = smollm2.load_shipped(args.asset_dir)
  draft_ids = (draft_vocab.load(args.draft_vocab, cfg.base.vocab_size) if args.draft_vocab
               else None)
  return cfg, jax.device_put(params), draft_ids


def measure(args, loaded) -> tuple[dict, str]:
  """-> (result JSON, markdown table) over args.batch_sizes."""
  cfg, params, draft_ids = loaded
  rows = []
  for b in args.batch_sizes:
    rows += bench(cfg, params, b, args.repeats, args.cache_length, draft_ids)
    print(json.dumps(rows[-1]), flush=True)
  result = {"rows": rows, "repeats": args.repeats, "cache_length": args.cache_length,
            "device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
            "machine": machine(),
            "load_average": os.getloadavg()}
  return result, format_table(rows)
