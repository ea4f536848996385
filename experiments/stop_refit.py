r"""Refit the shipped model's stop head alone (to the trust gate, or to the training loss's stop
targets) and compare the decode decisions offline.

    python -m experiments.stop_refit --lines 6089:7289 --asset_out runs/stop_refit
    python -m experiments.stop_refit --targets gate,segments,correct,readable ...  # equal budget

Reads SmolLM2's distilled answers (hamburger_jax/recipes/data/smollm2_v2_sft.jsonl.gz, the given
line range: lines never used to train the shipped weights), segments them with the base's entropy
as the recipe does, runs the frozen model teacher forced on targets that run past each group's
end, and refits the stop head alone to "the next draft is kept by the gate and right" (`--targets
gate`), and / or to the segmentation's group ends ("segments") or those plus "the micro decoder's
next prediction is right" ("correct"), or those plus "the base reads the merged group right: its
next token after it is the answer's" ("readable"), each from the same frozen forward with the same
optimiser and steps (`hamburger_jax/train/stop_calibration.py`). Of the examples, the last
`--test_examples` are held out for the table, the `--val_examples` before them for early stopping.
The table applies the decode rule to the held-out positions with the shipped and the refit stop
head: tokens per macro step, micro steps run (each one a draft) and kept drafts that differ from
the answer. `--asset_out DIR` writes DIR/<target>: the shipped weights with that refit head, for
`python -m benchmarks.quality --asset_dir` and `python -m benchmarks.decode_speed --engine
batch,continuous --asset_dir`. Prints JSON and a table; writes the JSON with "provenance" to --out
(default docs/results/data/training/stop_refit.json).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import itertools
import json
import os
import shutil
import tempfile
import time

import numpy as np

from benchmarks.common import REPO, machine, markdown_table, results_dir, write_json

SFT = os.path.join(REPO, "hamburger_jax", "recipes", "data", "smollm2_v2_sft.jsonl.gz")


def segmented_examples(path: str, start: int, end: int, base_cfg, base_params):
  """Lines [start, end) of a distilled jsonl(.gz) -> (prompt, response, group sizes) per answer."""
  from hamburger_jax.data.sources import SourceConfig, read_examples
  from hamburger_jax.data.strategies import SegmentationConfig
  from hamburger_jax.data.segmentation import segment_examples
  from hamburger_jax.data.tokenize import ChatTokenizer, TokenizeConfig, tokenize_examples
  from hamburger_jax.model.scoring import Scorer
  from hamburger_jax.shipped import smollm2
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt") as f:
    lines = list(itertools.islice(f, start, end))
  with tempfile.TemporaryDirectory() as tmp:
    with open(os.path.join(tmp, "sft.jsonl"), "w") as f:
      f.writelines(lines)
    tok = ChatTokenizer(TokenizeConfig(tokenizer_path=smollm2.write_tokenizer(tmp),
                                       template="chatml", system_prompt=smollm2.SYSTEM_PROMPT,
                                       max_length=512))
    counters = collections.Counter()
    raw = list(tokenize_examples(read_examples(SourceConfig(inputs=os.path.join(tmp, "sft.jsonl")),
                                               counters), tok, counters))
  seg = SegmentationConfig(strategy="decreasing_v2", min_value=1.0, ratio=0.5)
  out = segment_examples(raw, Scorer(base_cfg, base_params, max_length=512), seg)
  return [(s.tokens[:s.prompt_length], s.tokens[s.prompt_length:], s.steps) for s in out]


def write_asset(stop_params, out_dir: str) -> None:
  """The shipped asset (its draft vocabulary too) with `stop_params` (bf16) in place of its stop
  head."""
  import jax.numpy as jnp
  from flax import traverse_util
  from hamburger_jax.convert.safetensors_io import read_safetensors, write_safetensors
  from hamburger_jax.convert.shards import SINGLE, read_params, shard_files
  from hamburger_jax.shipped import smollm2
  os.makedirs(out_dir, exist_ok=True)
  for name in ("hamburger_config.json", "manifest.json", "draft_vocab.json"):
    if os.path.exists(os.path.join(smollm2.ASSET_DIR, name)):
      shutil.copy(os.path.join(smollm2.ASSET_DIR, name), out_dir)
  tensors = read_params(smollm2.ASSET_DIR)             # params.safetensors or its shards
  first = (shard_files(smollm2.ASSET_DIR) or [os.path.join(smollm2.ASSET_DIR, SINGLE)])[0]
  metadata = read_safetensors(first)[1]
  for path, value in traverse_util.flatten_dict(stop_params).items():
    key = "micro_decoder/stop_head/" + "/".join(path)
    if key not in tensors or tensors[key].shape != value.shape:
      raise ValueError(f"{key}: not a stop-head tensor of the shipped weights.")
    tensors[key] = np.asarray(jnp.asarray(value, jnp.bfloat16))
  write_safetensors(os.path.join(out_dir, SINGLE), tensors, metadata)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", default=SFT)
  parser.add_argument("--lines", default="6089:7289", help="START:END of the distilled answers")
  parser.add_argument("--val_examples", type=int, default=200)
  parser.add_argument("--test_examples", type=int, default=200)
  parser.add_argument("--min_token_prob", type=float, default=0.8,
                      help="the gate the refit head is trained for (the shipped default)")
  parser.add_argument("--steps", type=int, default=3000)
  parser.add_argument("--targets", default="gate",
                      help="comma-separated stop targets to refit to: gate, segments, "
                           "correct, readable")
  parser.add_argument("--confidences", default="0.05,0.2,0.35,0.5,0.65")
  parser.add_argument("--asset_out", default="")
  parser.add_argument("--out", default=os.path.join(results_dir("training"), "stop_refit.json"),
                      help="the JSON ('' = print only)")
  return parser


def parse_args(argv=None):
  """-> (args, (start, end) of --lines, confidences, targets); usage errors exit."""
  parser = build_parser()
  args = parser.parse_args(argv)
  start, _, end = args.lines.partition(":")
  if not (start.isdigit() and end.isdigit() and int(start) < int(end)):
    parser.error(f"--lines must be START:END with 0 <= START < END, got {args.lines!r}.")
  start, end = int(start), int(end)
  for name in ("val_examples", "test_examples", "steps"):
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1, got {getattr(args, name)}.")
  if not 0.0 < args.min_token_prob <= 1.0:
    parser.error(f"--min_token_prob must be in (0, 1], got {args.min_token_prob}.")
  try:
    confidences = [float(c) for c in args.confidences.split(",")]
  except ValueError:
    confidences = []
  if not confidences or not all(0.0 < c <= 1.0 for c in confidences):
    parser.error(f"--confidences must be comma-separated values in (0, 1], got "
                 f"{args.confidences!r}.")
  from hamburger_jax.train.stop_calibration import TARGETS  # pylint: disable=import-outside-toplevel
  targets = args.targets.split(",")
  if not targets or len(set(targets)) != len(targets) or not set(targets) <= set(TARGETS):
    parser.error(f"--targets must be distinct comma-separated names of {', '.join(TARGETS)}, "
                 f"got {args.targets!r}.")
  if end - start <= args.val_examples + args.test_examples:
    parser.error(f"--lines {args.lines} leaves no training examples beside "
                 f"{args.val_examples} + {args.test_examples} held out.")
  return args, (start, end), confidences, targets


def refit(args, lines, confidences, targets) -> tuple[dict, dict]:
  """Collects the frozen model's outcomes, refits one head per target -> (result JSON, target ->
  refit stop-head params)."""
  # pylint: disable=import-outside-toplevel
  from hamburger_jax.shipped import smollm2
  from hamburger_jax.train import stop_calibration as sc
  t0 = time.time()
  cfg, params, _, base_cfg = smollm2.load_shipped()
  examples = segmented_examples(args.data, *lines, base_cfg, params["base"])
  outcomes = sc.collect(cfg, params, examples)
  n = len(examples)
  test = outcomes.example >= n - args.test_examples
  val = (outcomes.example >= n - args.test_examples - args.val_examples) & ~test
  held = sc.DraftOutcomes(*(np.asarray(x)[test] for x in outcomes))
  heads, fits, label_rates, fitted = {"shipped": held.stop}, {}, {}, {}
  for target in targets:
    y, valid = sc.labels(outcomes, args.min_token_prob, target)
    fitted[target], report = sc.fit(cfg, params["micro_decoder"]["stop_head"], outcomes.hidden,
                                    y, valid & ~test[:, None], val, steps=args.steps)
    fits[target], label_rates[target] = report._asdict(), float(y[valid].mean())
    heads[f"refit:{target}"] = sc.stop_logits(cfg, fitted[target], held.hidden)
  rows = [{"stop_head": head, "confidence": conf, "min_token_prob": args.min_token_prob,
           **sc.simulate(logits, held, conf, args.min_token_prob)}
          for conf in confidences for head, logits in heads.items()]
  result = {"lines": args.lines, "examples": n, "positions": int(len(outcomes.example)),
            "held_out_positions": int(test.sum()), "targets": targets, "fit": fits,
            "label_rate": label_rates, "rows": rows,
            "seconds": time.time() - t0, "machine": machine()}
  return result, fitted


def main(argv=None):
  args, lines, confidences, targets = parse_args(argv)
  result, fitted = refit(args, lines, confidences, targets)
  if args.asset_out:
    result["asset_out"] = {}
    for target, head in fitted.items():
      write_asset(head, os.path.join(args.asset_out, target))
      result["asset_out"][target] = os.path.join(args.asset_out, target)
  write_json(result, args.out, __spec__.name, argv)
  cols = ["stop_head", "confidence", "tokens_per_step", "micro_steps_per_step",
          "kept_per_micro_step", "wrong_drafts_per_step"]
  print(markdown_table(cols, [[r[c] if isinstance(r[c], str) else f"{r[c]:.3f}" for c in cols]
                              for r in result["rows"]]))
  print(json.dumps(result))


if __name__ == "__main__":
  main()
