"""Helpers shared by the benchmark scripts: a markdown table, the JSON file, list arguments."""

from __future__ import annotations

import argparse
import json
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
