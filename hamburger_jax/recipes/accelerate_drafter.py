"""The verification drafter trained further on an accelerator, within a time budget.

The second stage of `python -m hamburger_jax.recipes.smollm2 accelerate --drafter_minutes M`
(after the merged weights' stage; `recipes.accelerate` documents the GPU calls). In M minutes:

1. distil   the base's greedy answers (96 tokens at most, as the shipped ones) to broad training
            prompts no shipped answer answers (`broad_prompts`, the shipped answers excluded), in
            static batches of --distill_batch, for at most --distill_share of M (a batch is never
            cut) -> OUT/sft_more.jsonl.gz, to append to recipes/data/smollm2_v2_sft.jsonl.gz here
2. features the frozen base's features over the unmerged answers: the shipped answers'
            --drafter_lines and the new ones (training), --calibrate_lines, and the held-out
            --heldout_lines (`train.drafter_features`, in memory)
3. train    the shipped verification drafter (micro decoder + stop head): steps timed by a short
            probe and sized to the time left, then its stop head alone on the calibration answers
            (as `recipes.verify_drafter`); teacher-forced acceptance on the held-out answers before
            and after
4. export   OUT/verify_drafter.safetensors (bf16, the micro decoder; `--install`-able as the
            shipped one) and OUT/verify_drafter.json (how, acceptance before / after, machine)
"""

from __future__ import annotations

import gzip
import io
import json
import os
import time

import jax
import numpy as np

from hamburger_jax.recipes.accelerate_steps import log

FILES = ("sft_more.jsonl.gz", "verify_drafter.safetensors", "verify_drafter.json")
MAX_PROMPT_TOKENS = 128                          # as the shipped answers were distilled
EXPORT_S = 15.0                                    # acceptance after + export, kept free


def new_prompts(limit: int) -> list[str]:
  """Up to `limit` broad training prompts (kinds balanced, in distil order) that no shipped answer
  answers and that fit the recipe's prompt length."""
  import random
  from hamburger_jax.recipes import broad_prompts as bp
  from hamburger_jax.recipes.verify_drafter import DATA
  done = bp.answered_prompts(DATA)
  train = [p for p in bp.broad_prompts() if p["split"] == "train" and p["prompt"] not in done]
  rng = random.Random(0)
  chosen = bp.balanced(train, min(limit, len(train)), rng)
  return [p["prompt"] for p in bp.distill_order(bp.fitting(chosen, MAX_PROMPT_TOKENS), rng)]


def distill(prompts: list[str], batch: int, max_new_tokens: int, deadline: float) -> list[dict]:
  """The base's greedy answers {prompt, response, finish} to `prompts`, whole batches while
  time.time() < deadline (the last batch padded to `batch`: one compiled program)."""
  from hamburger_jax.data.distill import answer_record, sampler_generate
  from hamburger_jax.shipped.smollm2 import SYSTEM_PROMPT, cached_tokenizer_dir, load_base
  from hamburger_jax.text.tokenizer import Tokenizer
  tok = Tokenizer(cached_tokenizer_dir())
  cfg, params = load_base()
  generate = sampler_generate(cfg, params, cfg.eos_token_ids, MAX_PROMPT_TOKENS, max_new_tokens)
  out = []
  for a in range(0, len(prompts), batch):
    if time.time() >= deadline:
      break
    chunk = prompts[a:a + batch]
    ids = [tok.encode(p, chat=True, system=SYSTEM_PROMPT) for p in chunk]
    answers = generate(ids + [ids[-1]] * (batch - len(ids)))[:len(chunk)]
    out += [answer_record(p, a, cfg.eos_token_ids, tok.decode) for p, a in zip(chunk, answers)]
  return out


def write_answers(path: str, records: list[dict]) -> None:
  """JSONL, gzipped, byte-identical for the same records."""
  buf = io.BytesIO()
  with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as f:
    f.write("".join(json.dumps(r) + "\n" for r in records).encode("utf-8"))
  with open(path, "wb") as f:
    f.write(buf.getvalue())


def features(cfg, params, groups: list[list[dict]]) -> list[dict]:
  """The base's features over each group of unmerged answer records (`drafter_features`), all
  groups in one pass (one compiled program per length bucket)."""
  from hamburger_jax.shipped.smollm2 import SYSTEM_PROMPT, cached_tokenizer_dir
  from hamburger_jax.train import drafter_features as dfe
  tokenizer = os.path.join(cached_tokenizer_dir(), "tokenizer.json")
  pairs = [dfe.tokenize_answers(g, tokenizer, SYSTEM_PROMPT) for g in groups]
  cache = dfe.compute_features(cfg, params, [p for g in pairs for p in g], log_every=0)
  rows = np.cumsum([0] + [int(n) for n in cache["answer_rows"]])
  ends = np.cumsum([0] + [len(g) for g in pairs])
  return [{k: v[rows[a]:rows[b]] if k != "answer_rows" else v[a:b] for k, v in cache.items()}
          for a, b in zip(ends[:-1], ends[1:])]


def shipped_records(ranges: list[tuple[int, int]]) -> list[dict]:
  from hamburger_jax.recipes.verify_drafter import DATA
  from hamburger_jax.train.drafter_features import read_answers
  return [r for lines in ranges for r in read_answers(DATA, lines)]


def train_in_time(cfg, params, draft_ids, data, args, seconds: float):
  """The drafter trained for the steps that fit in `seconds` (a probe of `args.probe_steps` steps
  after a compiling one times them) -> (params, history, steps, seconds per step)."""
  from hamburger_jax.train import drafter
  t = time.time()
  # At least 2 steps: optax's warmup-cosine schedule needs a decay after its warmup step.
  _, probe = drafter.train(cfg, params, draft_ids, data, steps=1 + max(args.probe_steps, 1),
                           batch=args.drafter_batch, lr=args.drafter_lr, log_every=1,
                           log=lambda _: None)
  first = probe[0]["seconds"]
  step_s = (probe[-1]["seconds"] - first) / max(args.probe_steps, 1)
  left = seconds - (time.time() - t) - first
  steps = max(2, min(args.drafter_max_steps, int(left // max(step_s, 1e-9))))
  log(f"drafter: {step_s:.4f} s per step of batch {args.drafter_batch} (first {first:.0f} s): "
      f"{steps} steps")
  params, history = drafter.train(cfg, params, draft_ids, data, steps=steps,
                                  batch=args.drafter_batch, lr=args.drafter_lr,
                                  log_every=max(1, steps // 10), log=log)
  return params, history, steps, step_s


def run(args, out: str) -> dict:
  """Stages 1-4 (module docstring) in args.drafter_minutes -> the report written to OUT."""
  from hamburger_jax.decode import draft_vocab as draft_vocab_lib
  from hamburger_jax.decode.checkpoint import load_verify_drafter, verify_drafter_steps
  from hamburger_jax.decode.models import verify_depth
  from hamburger_jax.recipes.accelerate_steps import machine
  from hamburger_jax.recipes.verify_drafter import export, parse_lines, parse_ranges
  from hamburger_jax.shipped.smollm2 import ASSET_DIR, load_shipped
  from hamburger_jax.train import drafter
  from hamburger_jax.train.drafter_features import with_steps
  start = time.time()
  deadline = start + 60 * args.drafter_minutes
  os.makedirs(out, exist_ok=True)
  prompts = new_prompts(args.distill_prompts) if args.distill_prompts else []
  # The base's answers and argmax targets in full float32 (a GPU's default rounds dots to TF32:
  # near-ties would flip against the answers decoded here).
  with jax.default_matmul_precision("highest"):
    more = distill(prompts, args.distill_batch, args.distill_tokens,
                   start + 60 * args.drafter_minutes * args.distill_share) if prompts else []
  write_answers(os.path.join(out, FILES[0]), more)
  log(f"drafter: {len(more)} new answers distilled ({time.time() - start:.0f} s)")
  cfg, shipped, _, _ = load_shipped()
  params = load_verify_drafter(ASSET_DIR, shipped)
  draft_ids = draft_vocab_lib.load(os.path.join(ASSET_DIR, draft_vocab_lib.FILE_NAME))
  train_records = shipped_records(parse_ranges(args.drafter_lines)) + more
  with jax.default_matmul_precision("highest"):
    caches = features(cfg, shipped, [train_records, shipped_records([parse_lines(
        args.heldout_lines)]), shipped_records(parse_ranges(args.calibrate_lines))])
  depth = verify_drafter_steps(ASSET_DIR) or cfg.max_steps     # the shipped drafter's own
  data, heldout, calibrate = [drafter.prepare(with_steps(c, depth), draft_ids, cfg.base.vocab_size)
                              for c in caches]
  cfg, params = verify_depth(cfg, params, depth)
  before = drafter.acceptance(cfg, params, draft_ids, heldout)
  log(f"drafter: features of {len(train_records)} answers ({time.time() - start:.0f} s); "
      f"held out before: {_brief(before)}")
  seconds = deadline - time.time() - EXPORT_S - args.calibrate_share * 60 * args.drafter_minutes
  params, history, steps, step_s = train_in_time(cfg, params, draft_ids, data, args, seconds)
  params, calibration = drafter.train(cfg, params, draft_ids, calibrate, steps=args.calibrate_steps,
                                      batch=args.drafter_batch, lr=1e-3, stop_weight=1.0,
                                      stop_head_only=True, log=lambda _: None)
  after = drafter.acceptance(cfg, params, draft_ids, heldout)
  log(f"drafter: held out after: {_brief(after)}")
  how = {"data": "recipes/data/smollm2_v2_sft.jsonl.gz lines " + args.drafter_lines +
                 f" and {len(more)} answers distilled in this run ({FILES[0]})",
         "calibrate_lines": args.calibrate_lines, "heldout_lines": args.heldout_lines,
         "steps": steps, "batch": args.drafter_batch, "lr": args.drafter_lr,
         "seconds_per_step": round(step_s, 4), "calibrate_steps": args.calibrate_steps,
         "init": "the shipped verification drafter", "verify_steps": depth, "machine": machine(),
         "minutes": round((time.time() - start) / 60, 2)}
  export(os.path.join(out, FILES[1]), params["micro_decoder"], how)
  report = {"how": how, "heldout_before": before, "heldout_after": after,
            "history": history + [{**r, "stop_head_only": True} for r in calibration]}
  with open(os.path.join(out, FILES[2]), "w") as f:
    json.dump(report, f, indent=1)
  log(f"drafter: wrote {', '.join(FILES)} to {out} ({(time.time() - start) / 60:.1f} minutes)")
  return report


def check_lines(args) -> str:
  """'' when the line ranges parse and no training or calibration line is held out, else the
  problem in one line."""
  from hamburger_jax.recipes.verify_drafter import parse_lines, parse_ranges, trains_held_out
  try:
    held = parse_lines(args.heldout_lines)
    ranges = parse_ranges(args.drafter_lines) + parse_ranges(args.calibrate_lines)
  except ValueError as e:
    return str(e)
  if trains_held_out(ranges, held):
    return (f"--drafter_lines / --calibrate_lines overlap --heldout_lines {args.heldout_lines}: "
            "held-out answers must not be trained.")
  return ""


def _brief(m: dict) -> str:
  return (f"acceptance {' / '.join(f'{a:.3f}' for a in m['conditional_acceptance'])}, "
          f"{m['tokens_per_forward']:.3f} tokens per forward teacher forced, "
          f"{m['decoded_tokens_per_forward']:.3f} decoded (walk)")


def add_flags(p) -> None:
  """The stage's flags on the accelerate parser."""
  p.add_argument("--drafter_minutes", type=float, default=0.0,
                 help="minutes of --minutes for the verification drafter (0: skip the stage)")
  p.add_argument("--distill_prompts", type=int, default=30000,
                 help="drafter: new broad prompts to distil at most (0: none)")
  p.add_argument("--distill_batch", type=int, default=256)
  p.add_argument("--distill_tokens", type=int, default=96,
                 help="drafter: answer tokens at most (the shipped answers: 96)")
  p.add_argument("--distill_share", type=float, default=0.3,
                 help="drafter: share of its minutes the distillation may start batches in")
  p.add_argument("--calibrate_share", type=float, default=0.1,
                 help="drafter: share of its minutes kept for the stop head's refit")
  p.add_argument("--drafter_lines", default="0:9250,10000:16000",
                 help="drafter: training lines of the shipped answers (0-based, END excluded)")
  p.add_argument("--calibrate_lines", default="9250:9500")
  p.add_argument("--calibrate_steps", type=int, default=200)
  p.add_argument("--heldout_lines", default="9750:10000")
  p.add_argument("--drafter_batch", type=int, default=1024)
  p.add_argument("--drafter_lr", type=float, default=3e-4)
  p.add_argument("--drafter_max_steps", type=int, default=20000)
