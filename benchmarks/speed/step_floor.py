r"""`--engine floor`: the decode loop's time per iteration against its memory-bandwidth floor.

On one GPU (H100 or H200, JAX with CUDA; no network), one variant per command: on an H200 each
variant's process spends ~2 minutes setting up the random 1B model (its init and the stop head's
calibration compile) and ~1 minute on batch 1 and 8, so give each variant ~200 s:

    python -m benchmarks.speed.step_floor --preset llama3.2-1b --batch_sizes 1,8 \
        --variants no_command_buffers --budget_s 200 --out $OUT/floor.json
    python -m benchmarks.decode_speed --engine floor ...     # the same, through decode_speed

(a machine without this project's other requirements takes them from the wheels that
`python -m hamburger_jax.recipes.smollm2 accelerate --pack` stages: after that recipe's `--stage`
run, prefix `PYTHONPATH=/tmp/hamburger_stage/site:.`).

Dry run on a CPU (the bandwidth must then be given; 2 minutes on a shared 2-core Xeon):

    python -m benchmarks.speed.step_floor --preset small --batch_sizes 1,2 --bandwidth_tbs 0.02

Model: random weights of --preset (hamburger_jax.testing.fixtures.random_params) with the base
config's param_dtype and dtype replaced by bfloat16 (params and compute), then its stop head
rescaled on the stop logits met while decoding the first prompt (two batch-1 decodes, as
benchmarks/speed/sampler.py does on all rows) so that groups get 1..S tokens. Prompts:
--prompt_len random tokens per row; --max_new_tokens new tokens, greedy, no EOS.
Modes, at every batch size of --batch_sizes:
  base       the base model alone (`Sampler(..., base=True)`): one token per loop iteration;
  hamburger  HAMburger macro steps at --confidence (< 1: groups of 1..S tokens per iteration).
Per setting: one warm-up decode (compiles; its compile seconds are printed), then --repeats timed
decodes; their median decode time (prefill excluded) / loop iterations = ms per iteration.
Floor per iteration: the bytes one iteration must read at least (the base's weights once, as
stored, + the KV cache slots in use at the end: rows x layers x 2 x kv_heads x head_dim x slots
x itemsize) / --bandwidth_tbs (default from the device name: H200 4.8, H100 3.35 TB/s; required
on any other device). ratio = ms per iteration / floor ms (1 = at the bandwidth floor). The
micro decoder's weights are not in the floor: HAMburger's ratio holds its micro steps too.
Variants (--variants), each in its own process, since XLA reads XLA_FLAGS once per process:
  default             XLA's default flags;
  no_command_buffers  XLA_FLAGS += --xla_gpu_enable_command_buffer= (no CUDA graphs);
  int8                int8 weight-only params (hamburger_jax/model/quantize.py): the floor reads
                      the int8 weights and their scales.
Budget: each variant gets an equal share of what is left of --budget_s seconds when it starts;
a setting starts only if the longest setting so far in its process fits in what is left of that
share; the rest is skipped (printed, listed under "skipped"), and a variant still running at the
end of the whole budget is stopped. Table rows are printed as they finish, and the JSON
(with "provenance"; "complete": false until the end) is rewritten after every setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import REPO, markdown_table, positive_ints, results_dir, write_json
from benchmarks.speed.sampler import SMALL
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.model import quantize
from hamburger_jax.model.config import get_preset
from hamburger_jax.testing.fixtures import random_params, rescale_stop_head

MODULE = "benchmarks.speed.step_floor"
VARIANTS = {"default": {}, "no_command_buffers": {"xla_flags": "--xla_gpu_enable_command_buffer="},
            "int8": {"quantize": "int8"}}
BANDWIDTH_TBS = {"H200": 4.8, "H100": 3.35}          # HBM bandwidth by device name, TB/s
HEADER = ["variant", "mode", "B", "iterations", "tokens/iteration/row", "ms/iteration",
          "floor ms", "ratio", "compile s"]
DTYPE_NOTE = "bfloat16 params and compute (cfg.base.param_dtype and cfg.base.dtype replaced)"


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0],
                              epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--preset", default="llama3.2-1b", help="a config preset or 'small'")
  p.add_argument("--num_layers", type=int, default=None,
                 help="base layers instead of the preset's (a fast CPU check: 2)")
  p.add_argument("--batch_sizes", type=positive_ints, default=[1, 8, 64])
  p.add_argument("--variants", type=_variants, default=list(VARIANTS),
                 help=f"comma-separated, of {','.join(VARIANTS)}")
  p.add_argument("--bandwidth_tbs", type=float, default=None,
                 help="memory bandwidth in TB/s (default: H200 4.8, H100 3.35)")
  p.add_argument("--budget_s", type=float, default=220.0, help="wall seconds for the whole run")
  p.add_argument("--prompt_len", type=int, default=64)
  p.add_argument("--max_new_tokens", type=int, default=128)
  p.add_argument("--confidence", type=float, default=0.8, help="HAMburger's, in (0, 1)")
  p.add_argument("--repeats", type=int, default=3, help="timed decodes (the median counts)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default=os.path.join(results_dir("step_costs"), "step_floor.json"))
  p.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)   # one process's
  p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)   # epoch s: no setting after
  return p


def _variants(text: str) -> list[str]:
  names = [n for n in text.split(",") if n]
  if not names or set(names) - set(VARIANTS):
    raise argparse.ArgumentTypeError(f"{text!r}: comma-separated names of {', '.join(VARIANTS)}")
  return names


def parse_args(argv=None):
  parser = build_parser()
  args = parser.parse_args(argv)
  if not 0 < args.confidence < 1:
    parser.error(f"--confidence must be in (0, 1) (groups > 1), got {args.confidence}")
  if args.bandwidth_tbs is not None and args.bandwidth_tbs <= 0:
    parser.error(f"--bandwidth_tbs must be > 0, got {args.bandwidth_tbs}")
  if min(args.prompt_len, args.max_new_tokens, args.repeats) < 1 or args.budget_s <= 0:
    parser.error("--prompt_len, --max_new_tokens, --repeats and --budget_s must be positive")
  if args.num_layers is not None and args.num_layers < 2:
    parser.error(f"--num_layers must be >= 2 (feature taps), got {args.num_layers}")
  if not args.out:
    parser.error("--out is needed: the variants' processes add their rows to it")
  return args


# -- the floor ---------------------------------------------------------------------------------

def bandwidth_for(device_kind: str, given: float | None) -> tuple[float, str]:
  """-> (TB/s, where it came from): `given`, else by device name; ValueError if unknown."""
  if given is not None:
    return given, "--bandwidth_tbs"
  for name, tbs in BANDWIDTH_TBS.items():
    if name in device_kind.upper():
      return tbs, f"default for {name}"
  raise ValueError(f"no default memory bandwidth for device {device_kind!r}: give "
                   "--bandwidth_tbs (TB/s)")


def kv_bytes(base_cfg, rows: int, slots: float, itemsize: int) -> float:
  """Bytes of the KV cache slots in use: rows x layers x 2 x kv_heads x head_dim x slots x
  itemsize (slots: per row, their mean over rows)."""
  return (rows * base_cfg.num_layers * 2 * base_cfg.num_kv_heads * base_cfg.head_dim * slots
          * itemsize)


def floor_ms(num_bytes: float, bandwidth_tbs: float) -> float:
  """Milliseconds to read num_bytes at bandwidth_tbs TB/s."""
  return num_bytes / (bandwidth_tbs * 1e12) * 1e3


# -- one variant (its own process) ---------------------------------------------------------------

def bf16_config(preset: str, num_layers: int | None = None):
  """The preset's HamburgerConfig ('small': benchmarks/speed/sampler.py's) in bfloat16; with
  num_layers, that many base layers (feature taps moved below the last)."""
  cfg = SMALL if preset == "small" else get_preset(preset)
  layers = num_layers or cfg.base.num_layers
  taps = tuple(sorted({min(i, layers - 1) for i in cfg.feature_layers}))
  return cfg.replace(feature_layers=taps, base=dataclasses.replace(
      cfg.base, param_dtype="bfloat16", dtype="bfloat16", num_layers=layers))


class Timing(NamedTuple):
  result: Any                 # the last timed DecodeResult
  decode_s: float             # median of the timed decodes
  compile_s: float            # compiled in the warm-up
  times: list[float]          # every timed decode's seconds


def time_decode(sampler, prompts, n: int, repeats: int, **knobs) -> Timing:
  """A warm-up decode (compiles), then `repeats` timed."""
  first = sampler.decode(prompts, max_new_tokens=n, eos_ids=[], **knobs)
  runs = [sampler.decode(prompts, max_new_tokens=n, eos_ids=[], **knobs) for _ in range(repeats)]
  times = [r.decode_s for r in runs]
  return Timing(runs[-1], float(np.median(times)), first.compile_s, times)


def calibrate(sampler, prompt, args, new_tokens: int = 64) -> dict:
  """Rescales the HAMburger sampler's stop head (in place: same shapes, no recompile) so the stop
  logits met while decoding `prompt` (one row) have mean -1 and std 2, as the sampler benchmark
  does (benchmarks/speed/sampler.py, there on every row of the largest batch): decoding with full
  groups, then at --confidence. -> {"calibration_s", "calibration_compile_s"}."""
  t0, compile_s = time.time(), 0.0
  for confidence in (1e-6, args.confidence):
    r = sampler.decode(prompt, max_new_tokens=min(new_tokens, args.max_new_tokens),
                       confidence=confidence, eos_ids=[])
    compile_s += r.compile_s
    sampler.params = rescale_stop_head(sampler.params, np.concatenate(r.stop_logits), -1.0, 2.0)
  return {"calibration_s": time.time() - t0, "calibration_compile_s": compile_s}


def make_record(setting: dict, run: Timing, base_cfg, weight_bytes: int,
                bandwidth_tbs: float) -> dict:
  """setting {"variant", "mode", "batch", "confidence"} + its timing -> a record."""
  result, decode_s, compile_s, times = run
  stats, rows = result.stats(), setting["batch"]
  slots = stats["kv_slots_used"] / rows
  kv = kv_bytes(base_cfg, rows, slots, jnp.dtype(base_cfg.jnp_dtype).itemsize)
  ms = decode_s / result.iterations * 1e3
  floor = floor_ms(weight_bytes + kv, bandwidth_tbs)
  return {**setting, "iterations": result.iterations, "new_tokens": stats["new_tokens"],
          "tokens_per_iteration_per_row": stats["new_tokens"] / rows / result.iterations,
          "decode_s": decode_s, "decode_s_repeats": times, "compile_s": compile_s,
          "ms_per_iteration": ms, "weight_bytes": weight_bytes, "kv_slots_per_row": slots,
          "kv_bytes": kv, "floor_bytes": weight_bytes + kv, "bandwidth_tbs": bandwidth_tbs,
          "floor_ms": floor, "ratio": ms / floor}


def table_row(r: dict) -> list[str]:
  return [r["variant"], r["mode"], str(r["batch"]), str(r["iterations"]),
          f"{r['tokens_per_iteration_per_row']:.2f}", f"{r['ms_per_iteration']:.3f}",
          f"{r['floor_ms']:.3f}", f"{r['ratio']:.2f}", f"{r['compile_s']:.1f}"]


def update_json(path: str, **items) -> None:
  """Appends each item to the JSON's list of that name, or merges it into its dict."""
  with open(path) as f:
    result = json.load(f)
  for key, value in items.items():
    if isinstance(result[key], list):
      result[key].append(value)
    else:
      result[key].update(value)
  with open(path + ".tmp", "w") as f:
    json.dump(result, f, indent=1)
  os.replace(path + ".tmp", path)          # a run stopped mid-write leaves the last JSON whole


def load_variant(args):
  """-> (cfg, params, variant info); exits 2 when no bandwidth is known for the device."""
  t0 = time.time()
  device = jax.devices()[0]
  try:
    bandwidth, source = bandwidth_for(device.device_kind, args.bandwidth_tbs)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    sys.exit(2)
  cfg = bf16_config(args.preset, args.num_layers)
  params = random_params(cfg, args.seed)
  mode = VARIANTS[args.variant].get("quantize")
  params = quantize.apply_mode(params, cfg, mode)
  jax.block_until_ready(params)
  info = {"device": device.device_kind, "backend": jax.default_backend(),
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "weights": mode or "bfloat16",
          "bandwidth_tbs": bandwidth, "bandwidth_from": source,
          "base_weight_bytes": quantize.weight_bytes(params["base"]),
          "all_weight_bytes": quantize.weight_bytes(params), "setup_s": time.time() - t0}
  print(f"variant {args.variant}: {info['device']}, base weights "
        f"{info['base_weight_bytes'] / 1e6:.1f} MB, {bandwidth} TB/s ({source}), set up in "
        f"{info['setup_s']:.1f} s", flush=True)
  return cfg, params, info


def run_variant(args) -> None:
  """One variant's settings (this process); each record is added to args.out as it finishes."""
  cfg, params, info = load_variant(args)
  n, rows = args.max_new_tokens, max(args.batch_sizes)
  prompts = np.random.default_rng(args.seed).integers(
      3, cfg.base.vocab_size, (rows, args.prompt_len)).tolist()
  size = dict(cache_length=-(-(args.prompt_len + n) // 64) * 64, out_length=n)
  modes = {"base": (Sampler(cfg, params, base=True, **size), 1.0),
           "hamburger": (Sampler(cfg, params, **size), args.confidence)}
  calibration = calibrate(modes["hamburger"][0], prompts[:1], args)
  update_json(args.out, variants={args.variant: dict(info, **calibration)})
  spent = []                                    # seconds of each setting so far
  for b in args.batch_sizes:
    for mode, (sampler, confidence) in modes.items():
      name = f"{args.variant} {mode} B={b}"
      if time.time() + max(spent, default=0.0) > args.deadline:
        print(f"skipped {name}: {max(args.deadline - time.time(), 0):.0f} s of the budget "
              "left", flush=True)
        update_json(args.out, skipped=name)
        continue
      t0 = time.time()
      run = time_decode(sampler, prompts[:b], n, args.repeats, confidence=confidence)
      if mode == "hamburger" and b == 1:        # compiled by the calibration
        run = run._replace(compile_s=run.compile_s + calibration["calibration_compile_s"])
      setting = dict(variant=args.variant, mode=mode, batch=b,
                     confidence=None if mode == "base" else confidence)
      record = make_record(setting, run, cfg.base, info["base_weight_bytes"],
                           info["bandwidth_tbs"])
      update_json(args.out, records=record)
      print("| " + " | ".join(table_row(record)) + " |", flush=True)
      spent.append(time.time() - t0)


# -- the run: one process per variant -------------------------------------------------------------

def child_command(args, variant: str, deadline: float) -> list[str]:
  flags = ["--preset", args.preset, "--batch_sizes", ",".join(map(str, args.batch_sizes)),
           "--prompt_len", str(args.prompt_len), "--max_new_tokens", str(args.max_new_tokens),
           "--confidence", str(args.confidence), "--repeats", str(args.repeats),
           "--seed", str(args.seed), "--out", args.out, "--variant", variant,
           "--deadline", repr(deadline)]
  for flag in ("bandwidth_tbs", "num_layers"):
    if getattr(args, flag) is not None:
      flags += [f"--{flag}", repr(getattr(args, flag))]
  return [sys.executable, "-m", MODULE, *flags]


def run_child(args, variant: str, share: float, deadline: float) -> int | None:
  """Runs one variant in its own process, which starts no setting past `share` (epoch s) ->
  its exit status, None if stopped at `deadline`."""
  env = dict(os.environ)
  extra = VARIANTS[variant].get("xla_flags")
  if extra:
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {extra}".strip()
  try:
    return subprocess.run(child_command(args, variant, share), cwd=REPO, env=env, check=False,
                          timeout=max(deadline - time.time(), 1.0)).returncode
  except subprocess.TimeoutExpired:
    return None


def read_json(path: str) -> dict:
  with open(path) as f:
    return json.load(f)


def run_meta(args) -> dict:
  return {"preset": args.preset, "num_layers": args.num_layers, "dtype": DTYPE_NOTE,
          "prompt_len": args.prompt_len, "new_tokens": args.max_new_tokens,
          "confidence": args.confidence, "repeats": args.repeats,
          "batch_sizes": args.batch_sizes, "budget_s": args.budget_s,
          "note": "greedy, no EOS; ms per iteration = median decode time / loop iterations; "
                  "floor = (base weight bytes + KV bytes in use at the end) / bandwidth; "
                  "ratio = ms / floor"}


def main(argv=None, module: str = MODULE, command_argv=None) -> dict:
  """The whole run -> the result written to --out. module / command_argv: the command that
  the provenance names (default: this module and argv)."""
  args = parse_args(argv)
  if args.variant:
    run_variant(args)
    return read_json(args.out)
  deadline = time.time() + args.budget_s
  command_argv = argv if command_argv is None else command_argv
  write_json({"complete": False, "records": [], "skipped": [], "variants": {},
              "meta": run_meta(args)}, args.out, module, command_argv)
  print(markdown_table(HEADER, []), flush=True)
  ok = True
  for i, variant in enumerate(args.variants):
    now = time.time()
    if now >= deadline:
      print(f"skipped variant {variant}: the budget is spent", flush=True)
      update_json(args.out, skipped=f"{variant} (all settings)")
      continue
    share = now + (deadline - now) / (len(args.variants) - i)    # what is left, shared fairly
    rc = run_child(args, variant, share, deadline)
    if rc is None:
      print(f"stopped variant {variant} at the budget", flush=True)
      if os.path.exists(args.out + ".tmp"):      # stopped while writing
        os.remove(args.out + ".tmp")
      update_json(args.out, skipped=f"{variant} (stopped at the budget)")
    ok = ok and rc == 0
    write_json(read_json(args.out), args.out, module, command_argv)
    if rc == 2:
      sys.exit(2)                                  # no bandwidth for this device: said above
  result = read_json(args.out)
  result["complete"] = ok and not result["skipped"]
  write_json(result, args.out, module, command_argv)
  print(markdown_table(HEADER, [table_row(r) for r in result["records"]]))
  if result["skipped"]:
    print("skipped: " + "; ".join(result["skipped"]))
  print(f"wrote {args.out}")
  return result


if __name__ == "__main__":
  main()
