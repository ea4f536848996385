"""A micro decoder (and stop head) trained for verified decoding of the shipped HAMburger-SmolLM2.

    python -m hamburger_jax.recipes.verify_drafter --workdir runs/verify_drafter \
        --lines 0:750 --calibrate_lines 750:1000 --heldout_lines 9750:10000 --steps 700

Steps (each resumable; the base runs only in the first):
  features  the frozen base's features over unmerged distilled answers
            (hamburger_jax/recipes/data/smollm2_v2_sft.jsonl.gz), cached in chunks of 250 answers
            under WORKDIR/features/{train,heldout}/ (`hamburger_jax.train.drafter_features`)
  train     the micro decoder + stop head from the shipped ones, on the cache
            (`hamburger_jax.train.drafter`); then the stop head alone on answers the drafter
            never saw (--calibrate_lines: it learns the acceptance it will meet, not the
            drafter's fit); teacher-forced acceptance on the held-out answers before and after,
            and the tokens per forward decoding them would get (`drafter.decode_walk`)
            -> WORKDIR/report.json
  export    WORKDIR/verify_drafter.safetensors (bf16, the micro decoder only); copy it into the
            checkpoint dir (`--install`) to have `--verify` decode with it
            (`hamburger_jax.decode.checkpoint.VERIFY_DRAFTER_FILE`).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "smollm2_v2_sft.jsonl.gz")
CHUNK = 250


def parse_lines(text: str) -> tuple[int, int]:
  """"0:3000" -> (0, 3000) (0-based answer lines, end exclusive)."""
  first, _, end = text.partition(":")
  try:
    a, b = int(first), int(end)
  except ValueError:
    raise ValueError(f"line range must look like 0:3000, got {text!r}.") from None
  if not 0 <= a < b:
    raise ValueError(f"line range {text!r} is empty or negative.")
  return a, b


def parse_ranges(text: str) -> list[tuple[int, int]]:
  """"0:9250,10000:16000" -> [(0, 9250), (10000, 16000)] (each as parse_lines)."""
  return [parse_lines(part) for part in text.split(",")]


def trains_held_out(ranges: list[tuple[int, int]], heldout: tuple[int, int]) -> bool:
  """Whether any training / calibration range shares a line with the held-out range."""
  return any(a < heldout[1] and heldout[0] < b for a, b in ranges)


def cache_features(cfg, params, directory: str, lines: tuple[int, int], data: str = DATA) -> dict:
  """Computes the missing chunks of `lines` into `directory`; -> all of them concatenated."""
  from hamburger_jax.shipped.smollm2 import SYSTEM_PROMPT, cached_tokenizer_dir
  from hamburger_jax.train import drafter_features as dfe
  os.makedirs(directory, exist_ok=True)
  tokenizer = os.path.join(cached_tokenizer_dir(), "tokenizer.json")
  paths = []
  for a in range(lines[0], lines[1], CHUNK):
    b = min(a + CHUNK, lines[1])
    path = os.path.join(directory, f"lines_{a:05d}_{b:05d}.npz")
    if not os.path.isfile(path):
      t0 = time.time()
      pairs = dfe.tokenize_answers(dfe.read_answers(data, (a, b)), tokenizer, SYSTEM_PROMPT)
      dfe.save_cache(path, dfe.compute_features(cfg, params, pairs, log_every=0))
      print(f"features {path}: {time.time() - t0:.0f} s", flush=True)
    paths.append(path)
  parts = [dfe.load_cache(p) for p in paths]
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def export(path: str, micro_params, how: dict) -> None:
  """The micro decoder's params in bf16 (keys "micro_decoder/..."); how["verify_steps"], when
  given, becomes the "verify_steps" metadata that `--verify` decodes at by default."""
  import jax
  import ml_dtypes
  from hamburger_jax.convert.native import flatten
  from hamburger_jax.convert.safetensors_io import write_safetensors
  flat = {f"micro_decoder/{k}": np.asarray(v).astype(ml_dtypes.bfloat16)
          for k, v in flatten(jax.device_get(micro_params)).items()}
  meta = {"format": "hamburger_jax.verify_drafter", "how": json.dumps(how, sort_keys=True)}
  if "verify_steps" in how:                       # the depth decoding takes by default
    meta["verify_steps"] = str(how["verify_steps"])
  write_safetensors(path, flat, meta)


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", required=True)
  p.add_argument("--lines", default="0:3000",
                 help="training answers: line ranges of the data, e.g. 0:9250,10000:16000")
  p.add_argument("--heldout_lines", default="9750:10000", help="held-out answers (never trained)")
  p.add_argument("--steps", type=int, default=1500)
  p.add_argument("--batch", type=int, default=256)
  p.add_argument("--lr", type=float, default=3e-4)
  p.add_argument("--stop_weight", type=float, default=0.5)
  p.add_argument("--soft_weight", type=float, default=0.0,
                 help="share of the base's own next-token distributions in the draft targets "
                      "(0: its greedy tokens alone; `train.drafter`)")
  p.add_argument("--verify_steps", type=int, default=4,
                 help="tokens a verified forward commits at most (drafts + 1) that the drafter "
                      "is trained and measured for; recorded in its export")
  p.add_argument("--visited_weight", type=int, default=1,
                 help="draw the positions decoding visits (walking the training answers with "
                      "the starting drafter) this many times as often as the others")
  p.add_argument("--calibrate_lines", default=None,
                 help="answers (never trained by the drafter) the stop head alone learns from")
  p.add_argument("--calibrate_steps", type=int, default=200)
  p.add_argument("--resume", action="store_true",
                 help="start from WORKDIR/verify_drafter.safetensors instead of the shipped one")
  p.add_argument("--features_only", action="store_true")
  p.add_argument("--install", default=None, help="copy the export into this checkpoint dir")
  return p


def check_args(a) -> tuple[list[tuple[int, int]], tuple[int, int]]:
  """-> (training line ranges, held-out lines); a one-line exit for what cannot run."""
  try:
    lines, heldout_lines = parse_ranges(a.lines), parse_lines(a.heldout_lines)
    ranges = lines + (parse_ranges(a.calibrate_lines) if a.calibrate_lines else [])
  except ValueError as e:
    raise SystemExit(f"verify_drafter: {e}") from None
  if not 0.0 <= a.soft_weight <= 1.0:
    raise SystemExit(f"verify_drafter: --soft_weight must lie in [0, 1], got {a.soft_weight}.")
  if not 2 <= a.verify_steps <= 16:
    raise SystemExit(f"verify_drafter: --verify_steps must be in 2..16, got {a.verify_steps}.")
  if a.visited_weight < 1:
    raise SystemExit("verify_drafter: --visited_weight must be >= 1 (1: every position alike).")
  if trains_held_out(ranges, heldout_lines):
    raise SystemExit("--lines / --calibrate_lines overlap --heldout_lines: held-out answers must "
                     "not be trained.")
  resume_from = os.path.join(a.workdir, "verify_drafter.safetensors")
  if a.resume and not a.features_only and not os.path.isfile(resume_from):
    raise SystemExit(f"--resume: there is no {resume_from} to start from; train once without "
                     "--resume (it starts from the shipped micro decoder).")
  return lines, heldout_lines


def main(argv=None) -> None:
  a = _parser().parse_args(argv)
  lines, heldout_lines = check_args(a)

  from hamburger_jax.decode import draft_vocab as draft_vocab_lib
  from hamburger_jax.decode.checkpoint import load_verify_drafter
  from hamburger_jax.decode.models import verify_depth
  from hamburger_jax.train.drafter_features import with_steps
  from hamburger_jax.shipped.smollm2 import ASSET_DIR, load_shipped
  from hamburger_jax.train import drafter
  cfg, shipped, _, _ = load_shipped()
  draft_ids = draft_vocab_lib.load(os.path.join(ASSET_DIR, draft_vocab_lib.FILE_NAME))
  def features(name, ranges):        # cached at the shipped S, re-cut to --verify_steps
    parts = [cache_features(cfg, shipped, os.path.join(a.workdir, "features", name), r)
             for r in ranges]
    cache = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return drafter.prepare(with_steps(cache, a.verify_steps), draft_ids, cfg.base.vocab_size)
  heldout = features("heldout", [heldout_lines])
  train_data = features("train", lines) if a.steps else None
  calibrate = features("train", parse_ranges(a.calibrate_lines)) if a.calibrate_lines else None
  if a.features_only:
    return
  cfg, shipped = verify_depth(cfg, shipped, a.verify_steps)
  params = load_verify_drafter(a.workdir, shipped) if a.resume else shipped
  before = drafter.acceptance(cfg, shipped, draft_ids, heldout)
  print("held-out acceptance, shipped micro decoder:", json.dumps(before), flush=True)
  t0, history = time.time(), []
  if a.steps:
    rows = (drafter.walk_weighted_rows(cfg, params, draft_ids, train_data, a.visited_weight)
            if a.visited_weight > 1 else None)
    params, history = drafter.train(cfg, params, draft_ids, train_data, steps=a.steps,
                                    batch=a.batch, lr=a.lr, stop_weight=a.stop_weight,
                                    soft_weight=a.soft_weight, rows=rows)
  if calibrate is not None:
    params, calibration = drafter.train(cfg, params, draft_ids, calibrate,
                                        steps=a.calibrate_steps, batch=a.batch, lr=a.lr,
                                        stop_weight=1.0, stop_head_only=True)
    history += [{**row, "stop_head_only": True} for row in calibration]
  after = drafter.acceptance(cfg, params, draft_ids, heldout)
  print("held-out acceptance after:", json.dumps(after), flush=True)
  how = {"data": os.path.relpath(DATA), "lines": a.lines, "heldout_lines": a.heldout_lines,
         "calibrate_lines": a.calibrate_lines, "steps": a.steps, "batch": a.batch, "lr": a.lr,
         "stop_weight": a.stop_weight, "soft_weight": a.soft_weight,
         "verify_steps": a.verify_steps,
         "visited_weight": a.visited_weight,
         "calibrate_steps": a.calibrate_steps if calibrate else 0,
         "init": "WORKDIR/verify_drafter.safetensors" if a.resume else "the shipped micro decoder",
         "minutes": round((time.time() - t0) / 60, 1)}
  report = {"how": how, "heldout_before": before, "heldout_after": after, "history": history}
  with open(os.path.join(a.workdir, "report.json"), "w") as f:
    json.dump(report, f, indent=2)
  out = os.path.join(a.workdir, "verify_drafter.safetensors")
  export(out, params["micro_decoder"], how)
  print(f"wrote {out}")
  if a.install:
    import shutil
    shutil.copy(out, os.path.join(a.install, "verify_drafter.safetensors"))


if __name__ == "__main__":
  main()
