"""The verified step's width rule (decode/draft_width.py): drafts worth their width's cost."""

import jax.numpy as jnp
import numpy as np
import pytest

from hamburger_jax.decode import draft_width
from hamburger_jax.decode.sampler import Sampler
from tests.decode.helpers import CACHE_LENGTH, OUT_LENGTH, drafting_model

WIDTHS = (1, 2, 4)


def _choose(num_drafts, accept, active=None, costs=(1.0, 1.25, 1.5)):
  num_drafts = jnp.asarray(num_drafts, jnp.int32)
  active = jnp.ones(num_drafts.shape, bool) if active is None else jnp.asarray(active)
  accept = jnp.asarray([[1.0] + list(a) for a in accept], jnp.float32)
  return draft_width.choose(num_drafts, accept, active, WIDTHS, costs).tolist()


def test_equal_costs_keep_every_draft():
  assert _choose([3, 1, 0], [[0.1, 0.1, 0.1]] * 3, costs=(1.0, 1.0, 1.0)) == [3, 1, 0]


def test_unlikely_drafts_are_not_worth_a_wider_forward():
  assert _choose([3], [[0.1, 0.5, 0.5]]) == [0]        # E: 1 / 1.1 / 1.185 against 1 / 1.25 / 1.5


def test_likely_drafts_buy_the_widest_forward():
  # E(4) = 1 + 0.9 + 0.81 + 0.729 = 3.44 -> 2.29 per cost; E(2) = 1.9 -> 1.52.
  assert _choose([3], [[0.9, 0.9, 0.9]]) == [3]


def test_the_middle_width_when_only_the_first_draft_is_likely():
  # E(2) = 1.8 -> 1.44 per cost; E(4) = 1.8 + 0.08 + 0.008 = 1.89 -> 1.26.
  assert _choose([3, 3], [[0.8, 0.1, 0.1]] * 2) == [1, 1]


def test_the_batch_shares_one_width_and_finished_rows_do_not_count():
  # One likely row and one hopeless one: together they still pay for width 4 ...
  assert _choose([3, 3], [[0.95, 0.95, 0.95], [0.0, 0.0, 0.0]]) == [3, 3]
  # ... and a finished row's drafts count for nothing.
  assert _choose([3, 3], [[0.0, 0.0, 0.0], [0.95, 0.95, 0.95]], active=[True, False]) == [0, 0]


def test_costs_take_the_nearest_measured_batch_below():
  assert draft_width.costs(1, WIDTHS) == draft_width.CPU_COSTS[1]
  assert draft_width.costs(16, WIDTHS) == draft_width.CPU_COSTS[8]
  assert draft_width.costs(64, WIDTHS) == draft_width.CPU_COSTS[32]
  c1, c2, c4 = draft_width.CPU_COSTS[1]
  assert draft_width.costs(1, (1, 2, 3)) == pytest.approx((c1, c2, (c2 + c4) / 2))


def _stop_head_says(params, continue_prob: float):
  """params whose stop head gives every position this continue-probability."""
  head = params["micro_decoder"]["stop_head"]["dense_2"]
  head = {"kernel": jnp.zeros_like(head["kernel"]),
          "bias": jnp.full_like(head["bias"], np.log((1 - continue_prob) / continue_prob))}
  stop_head = {**params["micro_decoder"]["stop_head"], "dense_2": head}
  return {**params, "micro_decoder": {**params["micro_decoder"], "stop_head": stop_head}}


@pytest.mark.parametrize("continue_prob", [0.1, 0.95])
def test_the_rule_keeps_the_base_answer_and_drafts_only_what_it_sends(continue_prob):
  cfg, params = drafting_model()
  params = _stop_head_says(params, continue_prob)    # each draft's estimated acceptance
  # The micro decoder's drafts alone (lookup drafts come with an estimate of 1: always sent).
  kw = dict(cache_length=CACHE_LENGTH, out_length=OUT_LENGTH, verify=True, lookup_drafts=0)
  base = Sampler(cfg, params, base=True, cache_length=CACHE_LENGTH, out_length=OUT_LENGTH)
  prompts = [[1, 5, 7], [3, 9, 11, 2, 4], [7], [8, 8, 8, 8]]
  want = base.decode(prompts, max_new_tokens=20).tokens
  # The same estimate from the drafts' own probabilities: a calibration with slope 0.
  calibration = ((0.0, float(np.log(continue_prob / (1 - continue_prob)))),)
  sent = {}
  for name, rule in (("off", False), ("stop head", True), ("calibrated", calibration)):
    got = Sampler(cfg, params, draft_width_rule=rule, **kw).decode(
        prompts, max_new_tokens=20, confidence=0.001)
    assert got.tokens == want
    sent[name] = np.sum(got.draft_counts[0])                 # drafts reached, all indices
  if continue_prob < 0.5:
    # 1.1 expected tokens per row pay for no wider forward (CPU_COSTS), so nothing is sent
    # (the stop head's estimate is known before drafting: nothing is drafted either).
    assert sent["stop head"] == sent["calibrated"] == 0 < sent["off"]
  else:
    # 0.95 per draft pays for width 4 at every step: the rule sends what is drafted without it.
    assert sent["stop head"] == sent["calibrated"] == sent["off"] > 0


def test_calibrated_estimates_map_each_drafts_probability():
  q = jnp.asarray([0.2, 0.5, 0.9])
  pairs = ((1.0, 0.0), (0.5, -1.0))
  np.testing.assert_allclose(draft_width.calibrated(1, jnp.log(q), pairs), q, rtol=1e-5)
  want = 1 / (1 + np.exp(-(0.5 * np.log(q / (1 - q)) - 1.0)))
  for j in (2, 3):                                   # past the last pair: the last pair
    np.testing.assert_allclose(draft_width.calibrated(j, jnp.log(q), pairs), want, rtol=1e-5)


def test_a_rule_is_off_the_stop_head_or_a_checked_calibration():
  assert [draft_width.resolve(r) for r in (None, False, True)] == [None, False, True]
  assert draft_width.resolve([[0.3, -1], [0.4, -1.2]]) == ((0.3, -1.0), (0.4, -1.2))
  for bad in ([], [[1.0]], [[float("nan"), 0.0]], "fast"):
    with pytest.raises(ValueError, match="slope, intercept"):
      draft_width.resolve(bad)


def _worth(j, accept, drafted, running=None, reach=3, looked=None, costs=(1.0, 1.25, 1.5)):
  """verify._drafting_rule's answer for rows with estimates accept [B, S-1] (index 1 on)."""
  from types import SimpleNamespace
  from hamburger_jax.decode import verify
  b = len(accept)
  engine = SimpleNamespace(draft_width_rule=True, max_steps=4)
  running = jnp.ones((b,), bool) if running is None else jnp.asarray(running)
  accept = jnp.asarray([[1.0] + list(a) for a in accept], jnp.float32)
  looked = None if looked is None else tuple(jnp.asarray(x) for x in looked)
  worth = verify._drafting_rule(engine, tuple(jnp.float32(c) for c in costs), b, running,
                                jnp.full((b,), reach, jnp.int32), looked)
  return bool(worth(j, accept, jnp.asarray(drafted, jnp.int32)))


def test_drafting_stops_where_the_rule_would_not_send_the_next_draft():
  # Before draft 1, its estimate stands for the later ones too: 0.9 -> E(4) = 3.44 pays for 4.
  assert _worth(1, [[0.9, 1.0, 1.0]], [-1])
  assert not _worth(1, [[0.1, 1.0, 1.0]], [-1])              # E: 1 / 1.1 / 1.11
  # Draft 1 likely, draft 2 not: width 2 is best (1.44 against 1.26), so draft 2 is not drafted.
  assert not _worth(2, [[0.8, 0.1, 1.0]], [-1])
  assert _worth(2, [[0.8, 0.9, 1.0]], [-1])
  # A row that stopped drafting counts the drafts it has; a finished row counts for nothing.
  assert not _worth(2, [[0.95, 0.95, 0.95]], [1])
  assert not _worth(1, [[0.95, 0.95, 0.95]], [-1], running=[False])


def test_looked_up_drafts_are_counted_as_sure_when_deciding_to_draft():
  # Row 0 drafts with the micro decoder (estimate 0.3: alone, not worth a wider forward); row 1
  # has 3 looked-up drafts, which pay for width 4 -- so row 0's drafts ride along.
  accept = [[0.3, 0.3, 0.3], [0.0, 0.0, 0.0]]
  assert not _worth(1, accept, [-1, 0])
  assert _worth(1, accept, [-1, 0], looked=([False, True], [3, 3]))
  assert not _worth(1, accept, [-1, 0], looked=([False, True], [0, 0]))
