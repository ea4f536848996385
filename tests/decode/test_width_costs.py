"""The width rule's costs: traced in the state, and timed on the decoding machine
(decode/width_costs.py)."""

import flax.struct
import numpy as np
import pytest

from hamburger_jax.decode import loop as lp
from hamburger_jax.decode import width_costs
from hamburger_jax.decode.prompts import DecodeInputError
from hamburger_jax.decode.sampler import Sampler
from tests.decode.helpers import CACHE_LENGTH, OUT_LENGTH, drafting_model

WIDTHS = (1, 2, 4)
PROMPTS = [[1, 5, 7], [3, 9, 11, 2, 4], [7], [8, 8, 8, 8]]


def _samplers(**kw):
  cfg, params = drafting_model()
  base = Sampler(cfg, params, base=True, cache_length=CACHE_LENGTH, out_length=OUT_LENGTH)
  verified = Sampler(cfg, params, cache_length=CACHE_LENGTH, out_length=OUT_LENGTH, verify=True,
                     lookup_drafts=0, draft_width_rule=True, **kw)
  return base, verified


def test_forced_widths_send_exactly_their_drafts_without_recompiling():
  base, sampler = _samplers()
  want = base.decode(PROMPTS, max_new_tokens=20).tokens
  sampler.decode(PROMPTS, max_new_tokens=20, confidence=0.001)          # compiled here
  before = dict(lp.TRACE_COUNTS)
  reached = {}
  for w in WIDTHS:
    state, rows = sampler.start(PROMPTS, max_new_tokens=20, confidence=0.001)
    state = sampler.run(state.replace(width_costs=width_costs.forcing(WIDTHS, w)))
    counts = np.asarray(state.draft_counts)[:rows, 0, 1:].sum(axis=0)  # reached per index 1..3
    tokens = [np.asarray(state.out_tokens)[r, :int(state.num_out[r])].tolist()
              for r in range(rows)]
    assert tokens == want, w
    reached[w] = counts.tolist()
  assert dict(lp.TRACE_COUNTS) == before
  assert reached[1] == [0, 0, 0]
  assert reached[2][0] > 0 and reached[2][1:] == [0, 0]
  assert all(c > 0 for c in reached[4])


def test_measured_costs_are_timed_once_per_batch_bucket_and_keep_the_answers(monkeypatch):
  calls = []
  real = width_costs.measure
  monkeypatch.setattr(width_costs, "measure",
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  base, sampler = _samplers(draft_width_costs="measure")
  want = base.decode(PROMPTS, max_new_tokens=20).tokens
  traced = dict(lp.TRACE_COUNTS)
  got = sampler.decode(PROMPTS, max_new_tokens=20, confidence=0.001)
  assert got.tokens == want
  # The timing ran the call's own executables: one prefill and one loop compiled in all.
  assert lp.TRACE_COUNTS["loop"] - traced.get("loop", 0) <= 1
  assert lp.TRACE_COUNTS["prefill"] - traced.get("prefill", 0) <= 1
  costs = sampler.measured_width_costs[4]
  assert costs[0] == 1.0 and len(costs) == 3 and all(np.isfinite(costs)) and min(costs) > 0
  assert costs != (1.0, 1.0, 1.0)                  # timed: what nothing to time would give
  assert sampler.decode(PROMPTS[:3], max_new_tokens=20, confidence=0.001).tokens == want[:3]
  assert len(calls) == 1 and list(sampler.measured_width_costs) == [4]
  sampler.decode(PROMPTS[:1], max_new_tokens=20, confidence=0.001)     # a new bucket: timed
  assert len(calls) == 2 and sorted(sampler.measured_width_costs) == [1, 4]


def test_given_costs_reach_the_state():
  _, sampler = _samplers(draft_width_costs=(1.0, 1.5, 2.5))
  state, _ = sampler.start(PROMPTS, max_new_tokens=8)
  assert [float(c) for c in state.width_costs] == [1.0, 1.5, 2.5]


@flax.struct.dataclass
class _FakeState:
  iteration: int = 0
  width_costs: tuple = ()


def test_measure_takes_each_widths_median_time_per_step_over_the_narrowest():
  seconds = {1: 0.04, 2: 0.05, 4: 0.08}        # per step at each width
  clock = [0.0]
  slow_round = iter([True] + [False] * 20)      # the first timed run of width 1 is an outlier

  def run(state, limit):
    w = WIDTHS[[float(c) for c in state.width_costs].index(1.0)]
    steps = int(limit) - int(state.iteration)
    clock[0] += steps * seconds[w] * (10.0 if w == 1 and int(state.iteration) and next(slow_round)
                                      else 1.0)
    return state.replace(iteration=limit)

  starts = []
  costs = width_costs.measure(lambda: starts.append(1) or _FakeState(), run, WIDTHS,
                              clock=lambda: clock[0])
  assert costs == pytest.approx((1.0, 1.25, 2.0))
  assert len(starts) == 1                        # one prefill, every run from a copy of it


def test_costs_are_checked():
  assert width_costs.check([1, 1.5, 2], WIDTHS) == (1.0, 1.5, 2.0)
  for bad in ([1, 2], [1, 0, 2], [1, float("inf"), 2], "fast", None):
    with pytest.raises(ValueError, match="draft_width_costs"):
      width_costs.check(bad, WIDTHS)
  cfg, params = drafting_model()
  with pytest.raises(DecodeInputError, match="one positive finite cost per forward width"):
    Sampler(cfg, params, verify=True, draft_width_rule=True, draft_width_costs=(1.0, 2.0))


def test_continuous_batching_times_its_costs_once_and_keeps_the_answers():
  from hamburger_jax.decode.batching import ContinuousBatcher, Request
  cfg, params = drafting_model()
  base, _ = _samplers()
  want = base.decode(PROMPTS, max_new_tokens=12).tokens
  traced = dict(lp.TRACE_COUNTS)
  batcher = ContinuousBatcher(cfg, params, num_slots=2, cache_length=CACHE_LENGTH,
                              chunk_steps=3, verify=True, lookup_drafts=0,
                              draft_width_rule=True, draft_width_costs="measure")
  costs = batcher.measured_width_costs
  assert costs[0] == 1.0 and len(costs) == 3 and all(np.isfinite(costs)) and min(costs) > 0
  assert costs != (1.0, 1.0, 1.0)                  # timed: what nothing to time would give
  assert [float(c) for c in batcher.state.width_costs] == pytest.approx(costs)
  done = batcher.generate([Request(p, max_new_tokens=12, confidence=0.001) for p in PROMPTS])
  assert [c.tokens for c in done] == want
  # Timing compiled the chunk the requests then ran (one), and admitted at the timing prompt's
  # bucket and these prompts' (one each at most).
  assert lp.TRACE_COUNTS["chunk"] - traced.get("chunk", 0) == 1
  assert lp.TRACE_COUNTS["admit"] - traced.get("admit", 0) <= 2
  given = ContinuousBatcher(cfg, params, num_slots=2, cache_length=CACHE_LENGTH, verify=True,
                            draft_width_rule=True, draft_width_costs=(1.0, 1.5, 2.5))
  assert [float(c) for c in given.state.width_costs] == [1.0, 1.5, 2.5]
  assert given.measured_width_costs is None
