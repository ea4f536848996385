"""Shared by the benchmarks and experiments: a markdown table, list arguments, the machine a result
was measured on, and the JSON file with its provenance (command, commit, date, machine)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from typing import Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPICS = ("quality", "serving", "step_costs", "tpu", "training")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
  """Header + rows (cells already formatted or str()-able) -> a markdown table."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def positive_int(text: str) -> int:
  """argparse type: "8" -> 8; anything else is a one-line usage error."""
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
  return value


def positive_ints(text: str) -> list[int]:
  """argparse type: "1,8,32" -> [1, 8, 32]; anything else is a one-line usage error."""
  try:
    values = [int(x) for x in text.split(",") if x.strip()]
  except ValueError:
    values = []
  if not values or min(values) < 1:
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a comma-separated list of positive integers (e.g. 1,8,32)")
  return values


def cpu_model() -> str:
  """The CPU's model name (e.g. "Intel(R) Xeon(R) Processor"), else the architecture.

  Figures on two 2-core x86 CPUs differ by up to 2.6x, and which of two equivalent kernels is
  faster can flip between them, so every benchmark JSON names the CPU.
  """
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def machine() -> str:
  """"<CPU model>, <N> cores": the machine line of every benchmark JSON."""
  return f"{cpu_model()}, {os.cpu_count()} cores"


def commit() -> str:
  """`git rev-parse --short HEAD` of this checkout, + "-dirty" when tracked files changed;
  "unknown" outside git."""
  def git(*args):
    return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True,
                          check=False, timeout=60)
  try:
    head = git("rev-parse", "--short", "HEAD")
    if head.returncode:
      return "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown"
  return head.stdout.strip() + ("-dirty" if dirty else "")


def provenance(module: str, argv: Sequence[str] | None = None) -> dict:
  """{"command", "commit", "date", "machine"} of this run; argv: the arguments (default: this
  process's), e.g. module "benchmarks.quality" -> "python -m benchmarks.quality --flags"."""
  args = list(sys.argv[1:] if argv is None else argv)
  return {"command": shlex.join(["python", "-m", module, *args]), "commit": commit(),
          "date": datetime.date.today().isoformat(), "machine": machine()}


def results_dir(topic: str) -> str:
  """docs/results/data/<topic> of this checkout: where a benchmark's JSON goes by default."""
  if topic not in TOPICS:
    raise ValueError(f"topic must be one of {', '.join(TOPICS)}, got {topic!r}.")
  return os.path.join(REPO, "docs", "results", "data", topic)


def write_json(result: dict, path: str | None, module: str,
               argv: Sequence[str] | None = None) -> dict:
  """Adds result["provenance"] (see `provenance`) and writes `result` to `path`, its folder made
  (nothing written when path is empty or None). Returns result."""
  result["provenance"] = provenance(module, argv)
  if path:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
      json.dump(result, f, indent=1)
  return result


def check_flag_groups(parser: argparse.ArgumentParser, args: argparse.Namespace,
                      groups: dict[str, dict], active: str) -> None:
  """groups: measurement -> {dest: default} of the flags only it takes. A usage error when a flag
  of a measurement other than `active` was given (differs from its default)."""
  for group, flags in groups.items():
    for dest, default in flags.items():
      if group != active and getattr(args, dest) != default:
        parser.error(f"--{dest} applies to the {group} measurement only (see --help).")
