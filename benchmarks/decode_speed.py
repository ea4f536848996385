r"""Decode speed of HAMburger against its base model, same prompts and weights, in one run.

    python -m benchmarks.decode_speed                          # sampler engine, tiny random weights
    python -m benchmarks.decode_speed --quick                  # a few minutes on a CPU
    python -m benchmarks.decode_speed --preset small --batch_sizes 1,8 --lengths 64,256,1024
    python -m benchmarks.decode_speed --ckpt /path/to/export_dir          # real weights
    python -m benchmarks.decode_speed --micro_layers 2,4       # ceiling by micro-decoder depth
    nice -n 10 python -m benchmarks.decode_speed --engine batch,continuous   # shipped, B 1, 8, 32
    python -m benchmarks.decode_speed --engine batch --batch_sizes 8 --num_prompts 8 \
        --max_new_tokens 16                                    # quick
    python -m benchmarks.decode_speed --engine continuous --length_spread 0.5
    python -m benchmarks.decode_speed --engine floor --preset llama3.2-1b --out $OUT/floor.json
    python -m benchmarks.decode_speed --engine startup      # decode.py's start, cache off/cold/warm

The measurements, picked by flags:
  --engine sampler (default)  `Sampler.decode` of random (or --ckpt) weights, base vs HAMburger
      at each confidence, per batch size and output length: tokens/s, tokens per KV slot, loop
      overhead (benchmarks/speed/sampler.py). JSON {"meta", "records"} and a PNG to
      docs/results/data/step_costs/decode_speed.json (.png).
  --micro_layers 2,4          the shipped model's base with random micro decoders of each depth
      whose stop head always continues: the decode-speed ceiling, batch 1
      (benchmarks/speed/micro_layers.py). JSON to docs/results/data/step_costs/micro_layers.json.
  --engine verify             verified decoding of the shipped model against its base on held-out
      mixed and code prompts, per batch size and drafting confidence, static batches and/or
      continuous batching (--verify_batching): same answers, tokens per forward, acceptance per
      draft, tokens/s (benchmarks/speed/verified.py). JSON to
      docs/results/data/quality/verify_speed.json.
  --engine batch,continuous   the shipped HAMburger-SmolLM2 on held-out prompts, static batches
      (`batch`, spelt `static` in the JSON) and/or continuous batching, per micro-step policy,
      with token agreement and base NLL (benchmarks/speed/batched.py). JSON {"rows",
      "components", ...} to docs/results/data/serving/batching_speed.json after every batch size.
  --engine floor              one GPU: ms per decode-loop iteration of the base and of HAMburger
      against the memory-bandwidth floor (weights + KV cache read once), per XLA-flags / int8
      variant (benchmarks/speed/step_floor.py, its own flags: --engine floor --help).
  --engine startup            decode.py processes from start to exit with XLA's persistent
      compilation cache off, cold and warm, and the shipped GGUF's header read by this project's
      reader and the `gguf` package's (benchmarks/speed/startup.py, its own flags: --engine
      startup --help). JSON to docs/results/data/serving/startup.json.
Every JSON also holds "provenance" (command, commit, date, machine). --out overrides the path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from benchmarks.common import (check_flag_groups, markdown_table, positive_ints, results_dir,
                               write_json)
from hamburger_jax.model import cpu_dots
from hamburger_jax.recipes.heldout import PROMPT_SETS

GROUPS = {            # flags that apply to one measurement only (dest: default)
    "sampler": {"preset": "tiny", "ckpt": None, "base_config": None, "lengths": "64,256,1024",
                "confidences": "0.5,0.7,0.8,0.9,1.0", "prompt_len": 32, "forward_repeats": 50,
                "stop_mean": -1.0, "stop_std": 2.0, "seed": 0, "quick": False},
    "batched": {"num_prompts": 32, "batch1_prompts": 8, "confidence": None,
                "min_token_prob": None, "asset_dir": None,
                "policies": "all,fraction:0.25,fraction:0.5,min_rows:4", "chunk_steps": 8,
                "length_spread": 0.0, "draft_vocabs": "shipped", "compare_compact": 0,
                "code_fences": 1},
    "verify": {"prompt_sets": "both,code", "draft_confidences": "0.001,0.3,0.5",
               "verify_prompts": 24, "verify_batching": "static", "width_rules": "off",
               "verify_steps": "", "draft_branches": "1", "drafter_quantize": "none",
               "lookup_drafts": "", "verify_temperature": 0.0},
}
DEFAULTS = {"sampler": dict(batch_sizes="1,8", out=("step_costs", "decode_speed.json")),
            "micro_layers": dict(max_new_tokens=128, out=("step_costs", "micro_layers.json")),
            "batched": dict(batch_sizes="1,8,32", max_new_tokens=64,
                            out=("serving", "batching_speed.json")),
            "verify": dict(batch_sizes="1,8,32", max_new_tokens=64,
                           out=("quality", "verify_speed.json"))}


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
  """The docstring's layout kept, every flag's default shown."""


class _Engines(argparse.Action):
  """--engine sampler | batch and/or continuous (static = batch) -> a list of names."""

  def __call__(self, parser, namespace, values, option_string=None):
    names = ["batch" if n == "static" else n for n in values.split(",") if n]
    if names not in (["sampler"], ["verify"]) and (
        not names or set(names) - {"batch", "continuous"}):
      parser.error(f"{option_string} must name static and/or continuous (static may be written "
                   f"batch), or be sampler, verify or floor alone; got {values!r}")
    setattr(namespace, self.dest, names)


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False,
                              formatter_class=_Formatter,
                              epilog=__doc__.split("\n\n", 1)[1])
  p.add_argument("--engine", "--engines", action=_Engines, default=["sampler"],
                 help="sampler (default), batch (= static) and/or continuous, verify, or floor")
  p.add_argument("--micro_layers", type=positive_ints, default=None,
                 help="micro-decoder depths to compare, e.g. 2,4 (sampler engine)")
  p.add_argument("--batch_sizes", default=None, help="comma-separated (default 1,8; batched "
                 "engines 1,8,32)")
  p.add_argument("--repeats", type=int, default=3, help="sampler: timed runs per setting (the "
                 "fastest counts); batched: timed runs in rotation (the median counts)")
  p.add_argument("--max_new_tokens", type=int, default=None,
                 help="batched engines (default 64) and --micro_layers (default 128)")
  p.add_argument("--out", default=None, help="the JSON (default under docs/results/data/)")
  p.add_argument("--cpu_dots", choices=cpu_dots.MODES, default=cpu_dots.DEFAULT,
                 help="batched and verify engines: XLA's CPU code path for the dots of the base "
                      "and HAMburger alike (model/cpu_dots.py)")
  s = p.add_argument_group("sampler engine")
  s.add_argument("--preset", help="model size for random weights: a config preset or 'small'")
  s.add_argument("--ckpt", help="benchmark these weights instead (any decode.py checkpoint)")
  s.add_argument("--base_config", help="base config.json for an original checkpoint")
  s.add_argument("--lengths", help="comma-separated output lengths (new tokens)")
  s.add_argument("--confidences", help="comma-separated confidences")
  s.add_argument("--prompt_len", type=int, help="prompt tokens per row (random ids)")
  s.add_argument("--forward_repeats", type=int, help="timed calls of the single base forward")
  s.add_argument("--stop_mean", type=float, help="random weights: mean stop logit")
  s.add_argument("--stop_std", type=float, help="random weights: std of stop logits")
  s.add_argument("--seed", type=int, help="weights and prompts seed")
  s.add_argument("--quick", action="store_true", help="lengths <= 256 only, 2 repeats")
  _batched_flags(p.add_argument_group("batch and continuous engines"))
  v = p.add_argument_group("verify engine")
  v.add_argument("--prompt_sets", help="held-out prompt sets, comma-separated (both, code, ..)")
  v.add_argument("--draft_confidences", help="drafting confidences, comma-separated")
  v.add_argument("--verify_prompts", type=int, help="prompts per set")
  v.add_argument("--verify_batching", choices=("static", "continuous", "static,continuous"),
                 help="static batches of b prompts and/or continuous batching over b slots")
  v.add_argument("--verify_steps",
                 help="depths of verified decoding, comma-separated, e.g. 4,6 (tokens a forward "
                      "commits at most; default: the verification drafter's own)")
  v.add_argument("--draft_branches",
                 help="draft chains a verified step checks as one tree, comma-separated, e.g. "
                      "1,2 (decode/draft_tree.py; default 1)")
  v.add_argument("--width_rules",
                 help="verified steps with the width rule (decode/draft_width.py), comma-"
                      "separated: on (the CPU cost table), measured (costs timed at start), off")
  v.add_argument("--drafter_quantize",
                 help="the drafter's weights, comma-separated: none and/or micro:int8 (the base "
                      "stays as stored; model/quantize.py)")
  v.add_argument("--lookup_drafts",
                 help="lookup drafts' least match, comma-separated, e.g. 0,2 (0: off; "
                      "decode/lookup_drafts.py; default: the engine's)")
  v.add_argument("--verify_temperature", type=float,
                 help="sample the base and verified decoding alike at this temperature (seed 0 "
                      "per batch; answers then agree in distribution, not token for token; "
                      "default 0: greedy)")
  p.set_defaults(**GROUPS["sampler"], **GROUPS["batched"], **GROUPS["verify"])
  return p


def _batched_flags(g) -> None:
  g.add_argument("--num_prompts", type=int, help="requests at batch >= 2")
  g.add_argument("--batch1_prompts", type=int, help="requests at batch 1")
  g.add_argument("--confidence", type=float,
                 help="default: the checkpoint's recommended knob (manifest), else 0.8")
  g.add_argument("--min_token_prob", type=float,
                 help="default: the checkpoint's recommended knob (manifest), else 0")
  g.add_argument("--asset_dir", help="the shipped model's weights (default: the package's)")
  g.add_argument("--policies", help="micro-step policies, comma-separated")
  g.add_argument("--chunk_steps", type=int, help="continuous: macro steps per engine call")
  g.add_argument("--length_spread", type=float,
                 help="continuous only: request i decodes max_new_tokens x (1 + u_i), u_i "
                      "uniform in [-spread, spread] (fixed seed), so rows finish at different "
                      "steps as in a server; 0: every request the same length")
  g.add_argument("--draft_vocabs", help="what HAMburger's drafts choose from, comma-separated, "
                 "each running every HAMburger setting: 'shipped' (the asset's draft_vocab.json "
                 "if it has one, else the whole vocabulary), 'full', or draft vocabulary files")
  g.add_argument("--compare_compact", type=int,
                 help="1: also run HAMburger with micro-step compaction on (batch >= 4)")
  g.add_argument("--code_fences", type=int, help="1: HAMburger's fenced code decodes one token "
                 "per macro step (the server's default); 0: it merges inside code too")


def _list_error(parser, flag: str, text: str, parse, ok, hint: str) -> None:
  """Exits 1 with `--flag=text: hint` unless ok(parse(text))."""
  try:
    valid = ok(parse(text))
  except (ValueError, argparse.ArgumentTypeError):
    valid = False
  if not valid:
    parser.exit(1, f"{parser.prog}: error: flag --{flag}={text}: {hint}\n")


def _confidences(text: str) -> list[float]:
  return [float(x) for x in text.split(",") if x.strip()]


def parse_args(argv=None):
  """-> (args with per-measurement defaults and lists parsed, measurement name)."""
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.micro_layers and args.engine != ["sampler"]:
    parser.error("--micro_layers runs with the sampler engine only.")
  mode = ("micro_layers" if args.micro_layers else "sampler") if args.engine == ["sampler"] \
      else "verify" if args.engine == ["verify"] else "batched"
  check_flag_groups(parser, args, GROUPS, mode)
  if mode in ("sampler", "micro_layers") and args.cpu_dots != cpu_dots.DEFAULT:
    parser.error("--cpu_dots applies to the batched and verify engines only.")
  if mode == "sampler" and args.max_new_tokens is not None:
    parser.error("--max_new_tokens applies to the batched engines and --micro_layers: the "
                 "sampler engine takes --lengths.")
  if mode == "micro_layers" and args.batch_sizes is not None:
    parser.error("--micro_layers decodes one row: --batch_sizes does not apply.")
  for dest, default in DEFAULTS[mode].items():
    if getattr(args, dest, None) is None:
      setattr(args, dest, os.path.join(results_dir(default[0]), default[1]) if dest == "out"
              else default)
  ints = "a comma-separated list of positive integers is needed, e.g. --{}=1,8"
  if mode != "micro_layers":
    _list_error(parser, "batch_sizes", args.batch_sizes, positive_ints, bool,
                ints.format("batch_sizes"))
    args.batch_sizes = positive_ints(args.batch_sizes)
  if mode == "sampler":
    _list_error(parser, "lengths", args.lengths, positive_ints, bool, ints.format("lengths"))
    _list_error(parser, "confidences", args.confidences, _confidences,
                lambda v: bool(v) and all(0 < c <= 1 for c in v),
                "comma-separated confidences in (0, 1] are needed, e.g. --confidences=0.5,0.8")
    args.lengths, args.confidences = positive_ints(args.lengths), _confidences(args.confidences)
  if mode == "batched":
    _check_batched(parser, args)
  if mode == "verify" and args.verify_steps:
    _list_error(parser, "verify_steps", args.verify_steps, positive_ints,
                lambda v: bool(v) and all(2 <= s <= 16 for s in v),
                "comma-separated depths in 2..16 are needed, e.g. --verify_steps=4,6")
  if mode == "verify":
    _list_error(parser, "drafter_quantize", args.drafter_quantize, lambda t: t.split(","),
                lambda v: all(m == "none" or m.startswith("micro:") and _is_mode(m) for m in v),
                "comma-separated drafter formats are needed: none and/or micro:<mode>, e.g. "
                "--drafter_quantize=none,micro:int8")
    _list_error(parser, "draft_branches", args.draft_branches, positive_ints,
                lambda v: bool(v) and all(1 <= k <= 8 for k in v),
                "comma-separated chain counts in 1..8 are needed, e.g. --draft_branches=1,2")
    if not 0.0 <= args.verify_temperature <= 10.0:
      parser.error(f"--verify_temperature must be in [0, 10] (0: greedy), got "
                   f"{args.verify_temperature}")
    if args.verify_temperature and args.verify_batching != "static":
      parser.error("--verify_temperature samples static batches: add --verify_batching=static")
    _list_error(parser, "prompt_sets", args.prompt_sets, lambda t: t.split(","),
                lambda v: set(v) <= set(PROMPT_SETS) and len(set(v)) == len(v),
                f"comma-separated held-out prompt sets are needed: {', '.join(PROMPT_SETS)}, "
                "e.g. --prompt_sets=both,code")
    _list_error(parser, "width_rules", args.width_rules, lambda t: t.split(","),
                lambda v: set(v) <= {"on", "measured", "off"} and len(set(v)) == len(v),
                "comma-separated width rules are needed: on, measured and/or off, e.g. "
                "--width_rules=measured,off")
    if args.lookup_drafts:
      _list_error(parser, "lookup_drafts", args.lookup_drafts,
                  lambda t: [int(x) for x in t.split(",")],
                  lambda v: bool(v) and all(0 <= m <= 8 for m in v),
                  "comma-separated least matches in 0..8 are needed, e.g. --lookup_drafts=0,2")
  return args, mode


def _is_mode(mode: str) -> bool:
  from hamburger_jax.model import quantize  # pylint: disable=import-outside-toplevel
  try:
    return bool(quantize.parse_mode(mode))
  except quantize.QuantizeError:
    return False


def _check_batched(parser, args) -> None:
  """Usage errors of the batched engines; fills the knobs the checkpoint recommends."""
  # pylint: disable=import-outside-toplevel
  from hamburger_jax.decode.checkpoint import resolve_knobs
  from hamburger_jax.shipped import smollm2
  if not 0 <= args.length_spread < 1:
    parser.error(f"--length_spread must be in [0, 1), got {args.length_spread}")
  if args.length_spread and "batch" in args.engine:
    parser.error("--length_spread needs --engines continuous (a static batch decodes one length)")
  args.asset_dir = args.asset_dir or smollm2.ASSET_DIR
  vars(args).update(resolve_knobs(vars(args), smollm2.decode_defaults(args.asset_dir)))


def run_sampler(args, argv) -> dict:
  from benchmarks.speed import sampler  # pylint: disable=import-outside-toplevel
  from hamburger_jax.convert import CheckpointError  # pylint: disable=import-outside-toplevel
  try:
    result = sampler.measure(args)
  except (sampler.WeightsError, CheckpointError) as e:
    sys.exit(f"error: {e}")
  write_json(result, args.out, __spec__.name, argv)
  print(json.dumps(result))
  if args.out:
    png = os.path.splitext(args.out)[0] + ".png"
    print(f"wrote {args.out}" + (f" and {png}" if sampler.plot(result["records"], png) else ""))
  return result


def run_micro_layers(args, argv) -> dict:
  from benchmarks.speed import micro_layers  # pylint: disable=import-outside-toplevel
  result = micro_layers.measure(args.micro_layers, args.max_new_tokens)
  base = result["base_tokens_per_s"]
  print(markdown_table(["model", "tokens/s", "vs base", "tokens per macro step"], [
      ["base", f"{base:.1f}", "1.00", "1.00"]] + [
          [f"{n} micro layers", f"{result[f'micro{n}_tokens_per_s']:.1f}",
           f"{result[f'micro{n}_speedup']:.2f}", f"{result[f'micro{n}_tokens_per_step']:.2f}"]
          for n in args.micro_layers]))
  write_json(result, args.out, __spec__.name, argv)
  print(json.dumps(result))
  return result


def run_batched(args, argv) -> dict:
  from benchmarks.speed import batched  # pylint: disable=import-outside-toplevel
  from hamburger_jax.decode import draft_vocab  # pylint: disable=import-outside-toplevel
  try:
    loaded = batched.load(args)
  except draft_vocab.DraftVocabError as e:
    build_parser().error(f"--draft_vocabs: {e}")
  result = batched.measure(args, loaded, lambda r: write_json(r, args.out, __spec__.name, argv))
  print(batched.format_table(result))
  print(json.dumps(result))
  return result


def run_verified(args, argv) -> dict:
  from benchmarks.speed import verified  # pylint: disable=import-outside-toplevel
  result = verified.measure(args)
  write_json(result, args.out, __spec__.name, argv)
  print(verified.format_table(result))
  print(json.dumps(result))
  return result


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
  pre.add_argument("--engine", "--engines")
  engine, rest = pre.parse_known_args(argv)
  if engine.engine == "floor":             # its own flags and processes
    from benchmarks.speed import step_floor  # pylint: disable=import-outside-toplevel
    return step_floor.main(rest, __spec__.name, argv)
  if engine.engine == "startup":           # its own flags, decode.py processes
    from benchmarks.speed import startup  # pylint: disable=import-outside-toplevel
    return startup.main(rest, __spec__.name, argv)
  args, mode = parse_args(argv)
  run = {"sampler": run_sampler, "micro_layers": run_micro_layers, "batched": run_batched,
         "verify": run_verified}[mode]
  return run(args, argv)


if __name__ == "__main__":
  main()
