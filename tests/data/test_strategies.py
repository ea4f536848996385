"""The four grouping strategies: hand-computed cases, boundaries and properties."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamburger_jax.data.strategies import (SegmentationConfig, entropy_threshold,
                                           group_decreasing, group_decreasing_v2, group_sizes,
                                           group_sliding, group_small_group)


def test_entropy_threshold_matches_explicit_distribution():
  for n, p in ((5, 0.6), (2, 0.5), (100, 0.95)):
    dist = np.array([p] + [(1 - p) / (n - 1)] * (n - 1))
    assert entropy_threshold(p, n) == pytest.approx(-(dist * np.log(dist)).sum(), rel=1e-12)
  assert entropy_threshold(1.0, 128256) == 0.0
  assert entropy_threshold(0.7, 128256) == pytest.approx(
      -(0.7 * math.log(0.7) + 0.3 * math.log(0.3 / 128255)))
  with pytest.raises(ValueError):
    entropy_threshold(0.0, 10)
  with pytest.raises(ValueError):
    entropy_threshold(0.5, 1)


@pytest.mark.parametrize("values,expected", [
    ([], []),
    ([0.01] * 6, [4, 2]),                               # all low: full groups
    ([1.0] * 3, [1, 1, 1]),                             # all high: singletons
    ([2.0, 0.5, 0.1, 0.01, 3.0, 0.9, 0.2], [4, 1, 2]),  # 0.9 == 0.3 * 3.0 does not join
    ([1.0, 0.01, 0.01, 0.01, 0.01], [4, 1]),            # group hits S
    ([0.01, 1.0], [1, 1]),
    ([1.0, 0.2, 0.25], [3]),
    ([0.0], [1]),
])
def test_decreasing_v2(values, expected):
  assert group_decreasing_v2(values, 4, min_value=0.05, ratio=0.3) == expected


@pytest.mark.parametrize("values,expected", [
    ([], []),
    ([2.0, 0.5, 0.7, 0.6, 0.1], [2, 1, 2]),
    ([0.0] * 6, [4, 2]),                                # all low: full groups
    ([1.0, 2.0, 3.0], [1, 1, 1]),                       # all high, rising
    ([1.0, 0.3], [2]),                                  # v == ratio * first joins
    ([1.0, 0.31], [1, 1]),
])
def test_decreasing(values, expected):
  assert group_decreasing(values, 4, ratio=0.3) == expected


@pytest.mark.parametrize("values,expected", [
    ([], []),
    ([0.1] * 4, [3, 1]),
    ([0.9, 0.1, 0.9, 0.1, 0.1], [2, 3]),
    ([0.1, 0.5], [1, 1]),                               # v == threshold opens a group
    ([0.9] * 3, [1, 1, 1]),
])
def test_sliding(values, expected):
  assert group_sliding(values, 3, threshold=0.5) == expected


@pytest.mark.parametrize("values,expected", [
    ([], []),
    ([0.1] * 7, [3, 3, 1]),
    ([0.9, 0.1, 0.1, 0.9, 0.1], [1, 2, 1, 1]),
    ([0.1, 0.9], [1, 1]),
    ([0.5, 0.5], [2]),                                  # v == threshold is not above it
    ([0.9] * 2, [1, 1]),
])
def test_small_group(values, expected):
  assert group_small_group(values, 3, threshold=0.5) == expected


def test_config_thresholds_and_dispatch():
  v = 1000
  sliding = SegmentationConfig("sliding")
  assert sliding.resolved_threshold(v) == pytest.approx(entropy_threshold(0.7, v))
  small = SegmentationConfig("small_group", vocab_size=128256)
  assert small.resolved_threshold(v) == pytest.approx(entropy_threshold(0.95, 128256))
  assert SegmentationConfig("sliding", metric="probability").resolved_threshold(v) == \
      pytest.approx(0.3)
  assert SegmentationConfig("sliding", threshold=0.25).resolved_threshold(v) == 0.25
  assert SegmentationConfig("decreasing_v2").resolved_threshold(v) is None
  values = [2.0, 0.5, 0.1, 0.01, 3.0, 0.9, 0.2]
  out = group_sizes(values, SegmentationConfig("decreasing_v2"), v)
  assert out.dtype == np.int32 and out.tolist() == [4, 1, 2]
  assert group_sizes(values, SegmentationConfig("decreasing_v2", max_steps=2), v).tolist() == \
      [2, 2, 1, 2]
  with pytest.raises(ValueError, match="Unknown strategy"):
    SegmentationConfig("nope")
  with pytest.raises(ValueError, match="max_steps"):
    SegmentationConfig(max_steps=0)


_values = st.lists(st.one_of(st.floats(0.0, 12.0, allow_nan=False), st.sampled_from(
    [0.0, 0.05, 0.3, 0.5, 1.0])), max_size=60)


@settings(max_examples=50, deadline=None)
@given(values=_values, max_steps=st.integers(1, 6),
       strategy=st.sampled_from(["decreasing_v2", "decreasing", "sliding", "small_group"]))
def test_sizes_partition_the_response(values, max_steps, strategy):
  sizes = group_sizes(values, SegmentationConfig(strategy, max_steps=max_steps), 50)
  assert int(sizes.sum()) == len(values)
  assert all(1 <= s <= max_steps for s in sizes.tolist())
  if max_steps == 1:
    assert sizes.tolist() == [1] * len(values)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 40), max_steps=st.integers(1, 5))
def test_constant_low_values_give_full_groups(n, max_steps):
  full = [max_steps] * (n // max_steps) + ([n % max_steps] if n % max_steps else [])
  assert group_decreasing_v2([0.0] * n, max_steps) == full
  assert group_sliding([0.0] * n, max_steps, 0.5) == full
  assert group_small_group([0.0] * n, max_steps, 0.5) == full
  assert group_decreasing([0.0] * n, max_steps) == full
  assert group_small_group([9.0] * n, max_steps, 0.5) == [1] * n
