"""Helpers shared by the benchmark scripts: a markdown table, the JSON file, list arguments, the
machine a result was measured on."""

from __future__ import annotations

import argparse
import json
import os
import platform
from typing import Sequence


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
  """Header + rows (cells already formatted or str()-able) -> a markdown table."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def write_json(result: dict, path: str | None) -> None:
  """Writes `result` to `path` (nothing when path is None)."""
  if path:
    with open(path, "w") as f:
      json.dump(result, f, indent=1)


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
