"""Fit the width rule's calibration for a checkpoint's verification drafter (spec §9).

    python -m hamburger_jax.recipes.acceptance_calibration --workdir runs/acceptance_calibration

Caches the base's features over the distilled answers --lines (answers the drafter never trained
on; `recipes.verify_drafter` trains on 0:9250 and 10000:16000 and refits its stop head on
9250:9500), fits `train/acceptance_calibration.py` there, reports it on --heldout_lines, and
writes CKPT_DIR/verify_calibration.json, which decode.py and the server then use for verified
decoding's width rule.
"""

from __future__ import annotations

import argparse
import json
import os

from hamburger_jax.recipes.verify_drafter import DATA, cache_features, parse_lines


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", required=True, help="where the features are cached")
  p.add_argument("--ckpt_dir", default=None, help="the checkpoint (default: the shipped one)")
  p.add_argument("--lines", default="9500:9750", help="answers to fit on (never trained on)")
  p.add_argument("--heldout_lines", default="9750:10000", help="answers to report on")
  return p


def main(argv=None) -> dict:
  a = _parser().parse_args(argv)
  try:
    lines, heldout = parse_lines(a.lines), parse_lines(a.heldout_lines)
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None

  from hamburger_jax.decode import draft_vocab as draft_vocab_lib
  from hamburger_jax.decode.checkpoint import (VERIFY_CALIBRATION_FILE, VERIFY_DRAFTER_FILE,
                                               load_verify_drafter, verify_drafter_steps)
  from hamburger_jax.decode.models import verify_depth
  from hamburger_jax.shipped.smollm2 import ASSET_DIR, load_shipped
  from hamburger_jax.train import acceptance_calibration as ac
  from hamburger_jax.train import drafter
  from hamburger_jax.train.drafter_features import with_steps
  ckpt_dir = a.ckpt_dir or ASSET_DIR
  drafter_path = os.path.join(ckpt_dir, VERIFY_DRAFTER_FILE)
  if not os.path.isfile(drafter_path):
    raise SystemExit(f"error: {drafter_path} does not exist: train one with "
                     "`python -m hamburger_jax.recipes.verify_drafter` first.")
  cfg, shipped, _, _ = load_shipped(ckpt_dir)
  draft_ids = draft_vocab_lib.load(os.path.join(ckpt_dir, draft_vocab_lib.FILE_NAME))
  steps = verify_drafter_steps(ckpt_dir) or cfg.max_steps
  vcfg, params = verify_depth(cfg, load_verify_drafter(ckpt_dir, shipped), steps)

  def measured(name, span):
    cache = cache_features(cfg, shipped, os.path.join(a.workdir, "features", name), span)
    data = drafter.prepare(with_steps(cache, steps), draft_ids, cfg.base.vocab_size)
    rest = draft_vocab_lib.rest_sample(draft_ids, cfg.base.vocab_size)
    return (ac.draft_probabilities(vcfg, params, draft_ids, rest, data),
            drafter.accepted_drafts(vcfg, params, draft_ids, data), data["answer_rows"])

  q, accepted, rows = measured("fit", lines)
  pairs = ac.fit(q, accepted, rows)
  how = {"data": os.path.relpath(DATA), "lines": a.lines, "verify_steps": steps,
         "fit": ac.report(q, accepted, rows, pairs),
         "heldout_lines": a.heldout_lines, "heldout": ac.report(*measured("heldout", heldout),
                                                                 pairs)}
  out = os.path.join(ckpt_dir, VERIFY_CALIBRATION_FILE)
  ac.write(out, pairs, drafter_path, how)
  print(json.dumps({"slope_intercept": pairs, **how}, indent=2))
  print(f"wrote {out}")
  return {"slope_intercept": pairs, **how}


if __name__ == "__main__":
  main()
