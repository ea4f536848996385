"""Statistics of a segmented dataset: examples, tokens, groups, tokens per group, size histogram."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Iterable, Mapping, Sequence


@dataclasses.dataclass
class SegmentStats:
  """Running totals over examples (prompt length, group sizes)."""
  examples: int = 0
  prompt_tokens: int = 0
  response_tokens: int = 0
  groups: int = 0
  histogram: collections.Counter = dataclasses.field(default_factory=collections.Counter)

  def add(self, prompt_length: int, steps: Sequence[int]) -> None:
    self.examples += 1
    self.prompt_tokens += int(prompt_length)
    self.response_tokens += int(sum(steps))
    self.groups += len(steps)
    self.histogram.update(int(s) for s in steps)

  def add_all(self, examples: Iterable[Any]) -> "SegmentStats":
    for ex in examples:
      self.add(ex.prompt_length, ex.steps)
    return self

  @property
  def tokens_per_group(self) -> float:
    """Response tokens per macro step: the expected decoding speed-up over one token per step."""
    return self.response_tokens / self.groups if self.groups else 0.0

  def to_dict(self) -> dict[str, Any]:
    return {"examples": self.examples, "prompt_tokens": self.prompt_tokens,
            "response_tokens": self.response_tokens, "groups": self.groups,
            "tokens_per_group": round(self.tokens_per_group, 4),
            "group_size_histogram": {str(k): v for k, v in sorted(self.histogram.items())}}

  def format(self, counters: Mapping[str, int] | None = None, width: int = 40) -> str:
    """A human-readable report (with the skip/truncation counters when given)."""
    lines = [f"examples          {self.examples}",
             f"prompt tokens     {self.prompt_tokens}",
             f"response tokens   {self.response_tokens}",
             f"groups            {self.groups}",
             f"tokens per group  {self.tokens_per_group:.3f}  (expected speed-up)",
             "group sizes:"]
    total = sum(self.histogram.values()) or 1
    top = max(self.histogram.values(), default=1)
    for size in sorted(self.histogram):
      n = self.histogram[size]
      bar = "#" * max(1, round(width * n / top))
      lines.append(f"  {size:>2}  {n:>10}  {100 * n / total:5.1f}%  {bar}")
    if counters:
      lines.append("input:")
      lines += [f"  {k:<24} {v}" for k, v in sorted(counters.items())]
    return "\n".join(lines)
