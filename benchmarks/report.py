"""Output helpers shared by the benchmark scripts: a markdown table and the JSON file."""

from __future__ import annotations

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
