"""Grouping strategies: per-token values of a response -> group sizes (HAMburger spec §7).

Each strategy maps values v [n] (entropy of the distribution that predicts each response token,
low = easy) to sizes [k] with `sum(sizes) == n` and every size in 1..S. An empty response gives [].

  decreasing_v2  a token joins the open group while (v < min_value or v < ratio * max v of the
                 group) and the group has fewer than S tokens; else it opens a new group.
  decreasing     a token opens a new group when v > ratio * (v of the group's first token) or the
                 group is full; else it joins.
  sliding        a token joins while v < threshold and the group is not full (threshold H(0.7)).
  small_group    a token with v > threshold is a group of its own; the others accumulate into
                 groups of up to S (threshold H(0.95)).

H(p) = -(p ln p + (1 - p) ln((1 - p) / (N - 1))): the entropy of a distribution over N tokens whose
top token has probability p and the rest share 1 - p uniformly.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

STRATEGIES = ("decreasing_v2", "decreasing", "sliding", "small_group")
METRICS = ("entropy", "probability")

# Default top-token probabilities behind the thresholds of `sliding` and `small_group`.
_DEFAULT_THRESHOLD_P = {"sliding": 0.7, "small_group": 0.95}


def entropy_threshold(p: float, vocab_size: int) -> float:
  """H(p) for a vocabulary of `vocab_size` tokens (0 when p == 1)."""
  if not 0.0 < p <= 1.0:
    raise ValueError(f"p must be in (0, 1], got {p}.")
  if vocab_size < 2:
    raise ValueError(f"vocab_size must be at least 2, got {vocab_size}.")
  if p == 1.0:
    return 0.0
  return -(p * math.log(p) + (1.0 - p) * math.log((1.0 - p) / (vocab_size - 1)))


def _check_steps(max_steps: int) -> None:
  if max_steps < 1:
    raise ValueError(f"max_steps must be >= 1, got {max_steps}.")


def _check_range(name: str, value: float, lo: float = -math.inf, hi: float = math.inf,
                 low_open: bool = False) -> None:
  """ValueError naming `name` (its --flag) unless `value` is a finite number in [lo, hi]."""
  ok = isinstance(value, (int, float)) and math.isfinite(value) and value <= hi and (
      value > lo if low_open else value >= lo)
  if not ok:
    span = "" if (lo, hi) == (-math.inf, math.inf) else (
        f" in {'(' if low_open else '['}{lo:g}, {hi:g}]")
    raise ValueError(f"{name} (--{name}) must be a finite number{span}, got {value!r}.")


def _cut(values: Sequence[float], max_steps: int,
         joins: Callable[[float, list[float]], bool]) -> list[int]:
  """Group sizes: a value joins the open group while the group has room and `joins(v, group)`."""
  _check_steps(max_steps)
  sizes: list[int] = []
  group: list[float] = []
  for v in values:
    if group and len(group) < max_steps and joins(v, group):
      group.append(v)
    else:
      if group:
        sizes.append(len(group))
      group = [v]
  if group:
    sizes.append(len(group))
  return sizes


def group_decreasing_v2(values: Sequence[float], max_steps: int, min_value: float = 0.05,
                        ratio: float = 0.3) -> list[int]:
  """Groups led by their largest value; all-small runs also merge (the released model's rule)."""
  return _cut(values, max_steps, lambda v, g: v < min_value or v < ratio * max(g))


def group_decreasing(values: Sequence[float], max_steps: int, ratio: float = 0.3) -> list[int]:
  """A new group starts when v > ratio * (first value of the open group) or the group is full."""
  return _cut(values, max_steps, lambda v, g: not v > ratio * g[0])


def group_sliding(values: Sequence[float], max_steps: int, threshold: float) -> list[int]:
  """A token joins the open group while v < threshold and the group is not full."""
  return _cut(values, max_steps, lambda v, g: v < threshold)


def group_small_group(values: Sequence[float], max_steps: int, threshold: float) -> list[int]:
  """Tokens above the threshold stand alone; the others fill groups of up to S."""
  return _cut(values, max_steps, lambda v, g: v <= threshold and g[-1] <= threshold)


@dataclasses.dataclass(frozen=True)
class SegmentationConfig:
  """How response tokens are scored and grouped.

  metric 'entropy' scores a token by the entropy of the distribution that predicts it;
  'probability' by 1 - p(token) (so that low still means easy, as every strategy assumes; with it
  `sliding`/`small_group` thresholds default to 1 - p instead of H(p)).
  """
  strategy: str = "decreasing_v2"
  max_steps: int = 4                   # S: largest group
  metric: str = "entropy"
  min_value: float = 0.05              # decreasing_v2: values below this always merge
  ratio: float = 0.3                   # decreasing(_v2): ratio to the group's max / first value
  threshold_p: float | None = None     # sliding / small_group: p of H(p) (default 0.7 / 0.95)
  threshold: float | None = None       # sliding / small_group: explicit threshold (overrides p)
  vocab_size: int | None = None        # N of H(p); None = the base model's vocabulary

  def __post_init__(self):
    if self.strategy not in STRATEGIES:
      raise ValueError(f"Unknown strategy {self.strategy!r}; choose one of {STRATEGIES}.")
    if self.metric not in METRICS:
      raise ValueError(f"Unknown metric {self.metric!r}; choose one of {METRICS}.")
    _check_steps(self.max_steps)
    _check_range("min_value", self.min_value)
    _check_range("ratio", self.ratio, 0.0, 1.0)
    if self.threshold_p is not None:
      _check_range("threshold_p", self.threshold_p, 0.0, 1.0, low_open=True)
    if self.threshold is not None:
      _check_range("threshold", self.threshold)
    if self.vocab_size is not None and self.vocab_size < 2:
      raise ValueError(f"vocab_size (--threshold_vocab_size) must be >= 2, got {self.vocab_size}.")

  def resolved_threshold(self, vocab_size: int) -> float | None:
    """The threshold of `sliding` / `small_group` (None for the other strategies)."""
    if self.strategy not in _DEFAULT_THRESHOLD_P:
      return None
    if self.threshold is not None:
      return float(self.threshold)
    p = self.threshold_p or _DEFAULT_THRESHOLD_P[self.strategy]
    if self.metric == "probability":
      return 1.0 - p
    return entropy_threshold(p, self.vocab_size or vocab_size)

  def grouper(self, vocab_size: int) -> Callable[[Sequence[float]], list[int]]:
    """values [n] -> sizes [k], with every parameter bound."""
    s = self.max_steps
    if self.strategy == "decreasing_v2":
      return lambda v: group_decreasing_v2(v, s, self.min_value, self.ratio)
    if self.strategy == "decreasing":
      return lambda v: group_decreasing(v, s, self.ratio)
    thr = self.resolved_threshold(vocab_size)
    if self.strategy == "sliding":
      return lambda v: group_sliding(v, s, thr)
    return lambda v: group_small_group(v, s, thr)


def group_sizes(values: Sequence[float] | np.ndarray, cfg: SegmentationConfig,
                vocab_size: int) -> np.ndarray:
  """values [n] -> int32 sizes [k] under `cfg` (vocab_size = N of H(p) unless cfg sets one)."""
  values = np.asarray(values, np.float64).tolist()
  return np.asarray(cfg.grouper(vocab_size)(values), np.int32)
