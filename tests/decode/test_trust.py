"""Decode-time trust control: a drafted token joins its group only if the model's probability of
it is >= min_token_prob (a traced knob); after a kept token the stop head decides as before."""

import numpy as np
import pytest

from hamburger_jax.decode import loop as loop_lib
from hamburger_jax.decode.sampler import DecodeInputError, Sampler
from tests.decode.helpers import check_against_teacher_forcing, small_model, small_sampler

PROMPTS = [[1, 17, 33, 250, 4], [1, 9, 3, 120, 77, 5, 6, 200, 11]]
KNOBS = dict(max_new_tokens=32, confidence=0.2, eos_ids=[])


def test_zero_is_the_stop_head_rule_alone():
  cfg, params = small_model(0)
  sampler = small_sampler(0)
  r = sampler.decode(PROMPTS, min_token_prob=0.0, **KNOBS)
  assert r.tokens == sampler.decode(PROMPTS, **KNOBS).tokens
  assert max(max(s) for s in r.group_sizes) == cfg.max_steps
  for row, prompt in enumerate(PROMPTS):
    assert check_against_teacher_forcing(cfg, params, prompt, r, row, KNOBS["confidence"]) > 10


@pytest.mark.slow
def test_one_gives_one_token_per_step_and_the_base_answer():
  cfg, params = small_model(0)
  knobs = dict(KNOBS, max_new_tokens=20)        # one KV slot per token: fits the buffer
  r = small_sampler(0).decode(PROMPTS, min_token_prob=1.0, **knobs)
  base = Sampler(cfg, params, base=True, cache_length=32, out_length=32).decode(
      PROMPTS, max_new_tokens=20, eos_ids=[])
  assert all(sizes == [1] * 20 for sizes in r.group_sizes)
  assert r.tokens == base.tokens


def test_only_trusted_drafts_join_a_group():
  cfg, params = small_model(0)
  sampler = small_sampler(0)
  mean_sizes, decisions = [], 0
  for trust in (0.0, 0.02, 0.05, 0.2):
    r = sampler.decode(PROMPTS, min_token_prob=trust, **KNOBS)
    for row, prompt in enumerate(PROMPTS):
      probs = np.exp(r.logprobs[row])
      i = 0
      for size in r.group_sizes[row]:
        assert (probs[i + 1:i + size] >= trust).all()    # every drafted token kept
        i += size
      if trust:        # group ends: the stop head, or a dropped draft (teacher-forced argmax)
        decisions += check_against_teacher_forcing(cfg, params, prompt, r, row,
                                                 KNOBS["confidence"], min_token_prob=trust)
    mean_sizes.append(np.mean([s for sizes in r.group_sizes for s in sizes]))
  assert mean_sizes == sorted(mean_sizes, reverse=True) and mean_sizes[0] > mean_sizes[-1]
  assert decisions > 10


@pytest.mark.slow
def test_no_recompilation_across_trust_values():
  sampler = small_sampler(0, cache_length=36, out_length=32)   # a fresh engine
  before = dict(loop_lib.TRACE_COUNTS)
  for trust in (0.0, 0.3, 0.7, 1.0):
    sampler.decode(PROMPTS, min_token_prob=trust, **KNOBS)
  traced = {k: loop_lib.TRACE_COUNTS[k] - before.get(k, 0) for k in ("prefill", "loop")}
  assert traced == {"prefill": 1, "loop": 1}


@pytest.mark.parametrize("trust", [-0.1, 1.5])
def test_bad_trust_value_is_rejected(trust):
  with pytest.raises(DecodeInputError, match="min_token_prob must be in"):
    small_sampler(0).decode(PROMPTS, min_token_prob=trust, **KNOBS)
