r"""What the pieces of a decode step cost, one measurement per run (picked by --what).

    python -m benchmarks.step_costs --what batch          # micro step, compaction on/off, B 8, 32
    python -m benchmarks.step_costs --what batch --batch_sizes 8 --repeats 10
    python -m benchmarks.step_costs --what batch --draft_vocab \
        hamburger_jax/assets/smollm2_hamburger/draft_vocab.json
    python -m benchmarks.step_costs --what macro_step     # one macro step per setting, B 1, 8, 32
    python -m benchmarks.step_costs --what macro_step --batch_sizes 8 --repeats 9
    python -m benchmarks.step_costs --what few_rows_head  # LM head at 1..32 rows
    python -m benchmarks.step_costs --what few_rows_head --rows 2,8 --repeats 50
    python -m benchmarks.step_costs --what verify_widths  # a verified forward at widths 1, 2, 4
    python -m benchmarks.step_costs --what verify_steps   # a whole verified step at widths 1, 2, 4
    python -m benchmarks.step_costs --what greedy_pick    # argmax over the vocabulary, two forms
    python -m benchmarks.step_costs --what timed_width_costs   # the width rule's costs timed
    python -m benchmarks.step_costs --what verify_profile # a verified step's time, part by part
    python -m benchmarks.step_costs --what cpu_dots       # dense layers and LM head, both CPU paths
    python -m benchmarks.step_costs --what dense_forms    # dense layers at R rows, four forms

  batch          one micro prefill + micro step of the shipped model at B rows when k continue,
                 on all B rows and on the k gathered (benchmarks/costs/batch.py)
  macro_step     one macro step of the continuous batcher, base vs HAMburger at confidence 1 and
                 at the shipped defaults, merge work skipped or always (costs/macro_step.py)
  few_rows_head  the LM head at few rows, XLA's dot vs `layers.attend_rows` (costs/few_rows_head.py)
  verify_widths  a verified step's base forward and LM head at widths 1, 2, 4, B 1, 8, 32
                 (costs/verify_widths.py)
  verify_steps   a whole verified step (forward, drafting, bookkeeping) at widths 1, 2, 4,
                 B 1, 8, 32 (costs/verify_steps.py; decode/draft_width.py's CPU_COSTS)
  greedy_pick    a greedy pick over the vocabulary: jnp.argmax vs `sampling.greedy_tokens`
                 (costs/greedy_pick.py)
  timed_width_costs  `Sampler(draft_width_costs="measure")` timing the width rule's costs at
                 start, B 1, 8: its seconds and the costs it times, repeated
                 (costs/timed_width_costs.py)
  verify_profile where a whole verified step at width 4 spends its time, B 1, 8: thread time per
                 part of the model from a jax.profiler trace (costs/verify_profile.py)
  cpu_dots       the base's dense layers and the tied LM head at 1-32 rows, compiled with XLA's
                 CPU defaults and with plain dots (costs/cpu_dots.py)
  dense_forms    the base's dense layers at 1-8 rows as a dot, a dot on transposed kernels, two
                 half-kernel dots and a YNNPACK reduction, all plain (costs/dense_forms.py)
Settings are timed in rotation and the median reported. Prints the JSON and a markdown table and
writes the JSON (with "provenance": command, commit, date, machine) to
docs/results/data/step_costs/{batch_costs,macro_step_costs,few_rows_head,verify_widths,
verify_steps,greedy_pick,timed_width_costs,verify_profile,cpu_dots,dense_forms}.json
unless --out.
"""

from __future__ import annotations

import argparse
import json
import os

from benchmarks.common import check_flag_groups, positive_ints, results_dir, write_json

GROUPS = {            # flags that apply to one measurement only (dest: default)
    "batch": {"cache_length": 128, "draft_vocab": ""},
    "macro_step": {"chunk_steps": 4, "num_prompts": 64},
    "few_rows_head": {"rows": [1, 2, 4, 8, 12, 16, 32], "vocab": 49152, "hidden": 576},
    "verify_widths": {},
    "verify_steps": {},
    "greedy_pick": {},
    "timed_width_costs": {},
    "verify_profile": {},
    "cpu_dots": {},
    "dense_forms": {},
}
DEFAULTS = {"batch": dict(batch_sizes=[8, 32], repeats=15, out="batch_costs.json"),
            "macro_step": dict(batch_sizes=[1, 8, 32], repeats=7, out="macro_step_costs.json"),
            "few_rows_head": dict(repeats=30, out="few_rows_head.json"),
            "verify_widths": dict(batch_sizes=[1, 8, 32], repeats=15, out="verify_widths.json"),
            "verify_steps": dict(batch_sizes=[1, 8, 32], repeats=3, out="verify_steps.json"),
            "greedy_pick": dict(repeats=30, out="greedy_pick.json"),
            "timed_width_costs": dict(batch_sizes=[1, 8], repeats=3,
                                      out="timed_width_costs.json"),
            "verify_profile": dict(batch_sizes=[1, 8], repeats=1, out="verify_profile.json"),
            "cpu_dots": dict(repeats=9, out="cpu_dots.json"),
            "dense_forms": dict(repeats=11, out="dense_forms.json")}
# random weights, no batch sizes
SHAPES_ONLY = ("few_rows_head", "greedy_pick", "cpu_dots", "dense_forms")


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
  """The docstring's layout kept, every flag's default shown."""


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False,
                              formatter_class=_Formatter, epilog=__doc__.split("\n\n", 1)[1])
  p.add_argument("--what", required=True, choices=list(DEFAULTS))
  p.add_argument("--batch_sizes", type=positive_ints, default=None,
                 help="batch 8,32; macro_step 1,8,32")
  p.add_argument("--repeats", type=int, default=None,
                 help="timed rounds (batch 15, macro_step 7, few_rows_head and greedy_pick 30)")
  p.add_argument("--asset_dir", default=None, help="the shipped model's weights (default: the "
                 "package's; batch and macro_step)")
  p.add_argument("--out", default=None, help="the JSON ('' = print only; default under "
                 "docs/results/data/step_costs/)")
  g = p.add_argument_group("--what batch")
  g.add_argument("--cache_length", type=int)
  g.add_argument("--draft_vocab", help="also time micro steps drafting from this draft "
                 "vocabulary file (decode/draft_vocab.py)")
  g = p.add_argument_group("--what macro_step")
  g.add_argument("--chunk_steps", type=int, help="macro steps per timed chunk")
  g.add_argument("--num_prompts", type=int, help="held-out prompts cycled through")
  g = p.add_argument_group("--what few_rows_head")
  g.add_argument("--rows", type=positive_ints)
  g.add_argument("--vocab", type=int)
  g.add_argument("--hidden", type=int)
  p.set_defaults(**{k: v for flags in GROUPS.values() for k, v in flags.items()})
  return p


def parse_args(argv=None):
  """-> (parser, args with the defaults of --what filled in)."""
  parser = build_parser()
  args = parser.parse_args(argv)
  check_flag_groups(parser, args, GROUPS, args.what)
  if args.what in SHAPES_ONLY and (args.batch_sizes or args.asset_dir):
    parser.error(f"--batch_sizes and --asset_dir do not apply to --what {args.what}.")
  for dest, default in DEFAULTS[args.what].items():
    if getattr(args, dest) is None:
      setattr(args, dest, os.path.join(results_dir("step_costs"), default) if dest == "out"
              else default)
  if args.what == "macro_step" and min(args.repeats, args.chunk_steps, args.num_prompts) < 1:
    parser.error("--repeats, --chunk_steps and --num_prompts must be >= 1.")
  if args.repeats < 1:
    parser.error(f"--repeats must be >= 1 (timed rounds), got {args.repeats}.")
  if args.what not in SHAPES_ONLY:
    from hamburger_jax.shipped import smollm2  # pylint: disable=import-outside-toplevel
    args.asset_dir = args.asset_dir or smollm2.ASSET_DIR
  return parser, args


def measure(parser, args) -> tuple[dict, str]:
  """-> (result JSON, markdown table) of args.what."""
  # pylint: disable=import-outside-toplevel
  if args.what == "few_rows_head":
    from benchmarks.costs import few_rows_head
    return few_rows_head.measure(args)
  if args.what == "macro_step":
    from benchmarks.costs import macro_step
    return macro_step.measure(args)
  if args.what == "verify_widths":
    from benchmarks.costs import verify_widths
    return verify_widths.measure(args)
  if args.what == "verify_steps":
    from benchmarks.costs import verify_steps
    return verify_steps.measure(args)
  if args.what == "greedy_pick":
    from benchmarks.costs import greedy_pick
    return greedy_pick.measure(args)
  if args.what == "timed_width_costs":
    from benchmarks.costs import timed_width_costs
    return timed_width_costs.measure(args)
  if args.what == "verify_profile":
    from benchmarks.costs import verify_profile
    return verify_profile.measure(args)
  if args.what == "cpu_dots":
    from benchmarks.costs import cpu_dots
    return cpu_dots.measure(args)
  if args.what == "dense_forms":
    from benchmarks.costs import dense_forms
    return dense_forms.measure(args)
  from benchmarks.costs import batch
  from hamburger_jax.decode import draft_vocab
  try:
    loaded = batch.load(args)
  except draft_vocab.DraftVocabError as e:
    parser.error(f"--draft_vocab: {e}")
  return batch.measure(args, loaded)


def main(argv=None):
  parser, args = parse_args(argv)
  result, table = measure(parser, args)
  write_json(result, args.out, __spec__.name, argv)
  print(table)
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
