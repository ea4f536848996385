"""Continuous batching on the small random model: every request decodes as it would alone (greedy
and seeded sampling), slots are refilled as requests come and go, no recompilation after warm-up,
stop ids, cancellation, bad input; and the batch-wide micro-step policy."""

import numpy as np
import pytest

from hamburger_jax.decode import loop as loop_lib
from hamburger_jax.decode.batching import ContinuousBatcher, Request
from hamburger_jax.decode.sampler import DecodeInputError, Sampler
from tests.decode.helpers import CACHE_LENGTH, small_model, small_sampler

RNG = np.random.default_rng(0)
# Mixed lengths over both prefill buckets (16 and 32), more requests than slots.
PROMPTS = [RNG.integers(3, 256, n).tolist() for n in (5, 1, 9, 17, 3, 12, 7, 20)]
MAX_NEW = [16, 5, 32, 9, 20, 3, 25, 11]
CONF = [0.3, 0.5, 0.2, 0.8, 0.3, 0.6, 0.4, 0.3]


@pytest.fixture(scope="module")
def batcher():
  cfg, params = small_model(0)
  return ContinuousBatcher(cfg, params, num_slots=3, cache_length=CACHE_LENGTH, chunk_steps=3)


def _alone(i, **knobs):
  return small_sampler(0).decode([PROMPTS[i]], max_new_tokens=MAX_NEW[i], confidence=CONF[i],
                                 **knobs)


def _run(b, ids, late=()):
  """Steps until idle; submits `late` requests (index list) after the second step. -> events."""
  events, submitted = {}, dict(ids)
  step = 0
  while b.has_work():
    for e in b.step():
      events.setdefault(e.request_id, []).append(e)
    step += 1
    if step == 2:
      for i in late:
        submitted[b.submit(Request(PROMPTS[i], MAX_NEW[i], CONF[i]))] = i
  return events, submitted


@pytest.mark.slow
def test_greedy_requests_decode_as_alone_while_others_come_and_go(batcher):
  ids = {batcher.submit(Request(PROMPTS[i], MAX_NEW[i], CONF[i])): i for i in range(5)}
  events, submitted = _run(batcher, ids, late=(5, 6, 7))
  assert sorted(submitted.values()) == list(range(8))
  for rid, i in submitted.items():
    alone, ev = _alone(i), events[rid]
    tokens = [t for e in ev for t in e.new_tokens]
    assert tokens == alone.tokens[0], f"request {i}"
    assert [e.finished for e in ev] == [False] * (len(ev) - 1) + [True]
    assert ev[-1].finish_reason == alone.finish_reasons[0] == "length"
    assert ev[-1].macro_steps == alone.macro_steps[0] and ev[-1].tokens == MAX_NEW[i]
    assert [e.tokens for e in ev] == np.cumsum([len(e.new_tokens) for e in ev]).tolist()
  assert not batcher.has_work()


@pytest.mark.slow
def test_generate_returns_completions_in_order_with_groups(batcher):
  done = batcher.generate([Request(PROMPTS[i], MAX_NEW[i], CONF[i]) for i in (3, 0, 2, 7)])
  for c, i in zip(done, (3, 0, 2, 7)):
    alone = _alone(i)
    assert c.tokens == alone.tokens[0] and c.group_sizes == alone.group_sizes[0]
    assert c.groups() == alone.groups(0) and c.macro_steps == alone.macro_steps[0]
    np.testing.assert_allclose(c.logprobs, alone.logprobs[0], atol=1e-5)
  assert max(max(c.group_sizes) for c in done) > 1


def test_no_recompilation_after_warm_up(batcher):
  batcher.generate([Request(PROMPTS[0], 4), Request(PROMPTS[7], 4)])     # both prompt buckets
  before = dict(loop_lib.TRACE_COUNTS)
  compile_s = batcher.compile_s
  reqs = [Request(PROMPTS[i], MAX_NEW[i], CONF[i], min_token_prob=0.1 * (i % 3),
                  temperature=0.5 * (i % 2), top_k=i, seed=i) for i in range(8)]
  batcher.generate(reqs)
  rid = batcher.submit(reqs[2])
  batcher.step()
  batcher.cancel(rid)
  batcher.generate(reqs[:2])
  assert {k: loop_lib.TRACE_COUNTS[k] - before.get(k, 0) for k in ("admit", "chunk")} == {
      "admit": 0, "chunk": 0}
  assert batcher.compile_s == compile_s


def test_seeded_sampling_equals_the_sampler_alone(batcher):
  knobs = dict(temperature=1.0, top_p=0.9, seed=7)
  c = batcher.generate([Request(PROMPTS[i], MAX_NEW[i], CONF[i], **knobs) for i in (2, 6)])
  for comp, i in zip(c, (2, 6)):
    assert comp.tokens == _alone(i, **knobs).tokens[0]
  assert c[0].tokens != _alone(2).tokens[0]


def test_stop_ids_end_the_request_after_the_stop_token(batcher):
  free = _alone(2).tokens[0]
  stop = free[6]
  c = batcher.generate([Request(PROMPTS[2], MAX_NEW[2], CONF[2], stop_ids=(stop, 999))])[0]
  assert c.finish_reason == "stop" and c.tokens == free[:free.index(stop) + 1]


def test_cancel_frees_the_slot_for_a_waiting_request(batcher):
  ids = [batcher.submit(Request(PROMPTS[i], 32, 0.9)) for i in (2, 2, 2, 4)]
  first = batcher.step()
  assert [e.request_id for e in first] == ids[:3]
  batcher.cancel(ids[1])
  batcher.cancel(ids[3])            # still waiting: dropped from the queue
  seen = set()
  while batcher.has_work():
    seen |= {e.request_id for e in batcher.step()}
  assert seen == {ids[0], ids[2]}


@pytest.mark.parametrize("request_kwargs, message", [
    (dict(prompt_ids=list(range(3, 3 + CACHE_LENGTH + 1))), "KV buffer holds 32 slots"),
    (dict(prompt_ids=[]), "is empty"),
    (dict(prompt_ids=[1, 400]), "outside the vocabulary"),
    (dict(prompt_ids=[1], confidence=0.0), "confidence must be in"),
    (dict(prompt_ids=[1], min_token_prob=2.0), "min_token_prob must be in"),
    (dict(prompt_ids=[1], max_new_tokens=0), "max_new_tokens must be >= 1"),
    (dict(prompt_ids=[1], top_p=0.0), "top_p"),
    (dict(prompt_ids=[1], stop_ids=tuple(range(9))), "At most 8 stop ids"),
])
def test_bad_requests_are_rejected_at_submit(batcher, request_kwargs, message):
  assert batcher.max_prompt_len == CACHE_LENGTH
  with pytest.raises(ValueError, match=message):
    batcher.submit(Request(**request_kwargs))
  assert not batcher.has_work()


def test_bad_policy_is_rejected():
  cfg, params = small_model(0)
  with pytest.raises(DecodeInputError, match="Unknown micro_policy 'some'"):
    ContinuousBatcher(cfg, params, num_slots=2, cache_length=16, micro_policy="some")


def test_base_batcher_decodes_as_the_base_sampler():
  cfg, params = small_model(0)
  b = ContinuousBatcher(cfg, params, base=True, num_slots=2, cache_length=CACHE_LENGTH,
                        chunk_steps=4)
  base = Sampler(cfg, params, base=True, cache_length=CACHE_LENGTH)
  picks = (0, 2, 4)
  done = b.generate([Request(PROMPTS[i], MAX_NEW[i]) for i in picks])
  for c, i in zip(done, picks):
    alone = base.decode([PROMPTS[i]], max_new_tokens=MAX_NEW[i])
    assert c.tokens == alone.tokens[0] and c.finish_reason == alone.finish_reasons[0]
    assert c.group_sizes == [1] * len(c.tokens) and len(c.tokens) == c.macro_steps


def test_a_finished_row_is_refilled_at_once_while_requests_wait():
  """With a request waiting, the chunk ends at the macro step in which a row finishes (its slot
  is refilled by the next step); with none waiting, a chunk runs all its macro steps. Answers
  are unchanged."""
  cfg, params = small_model(0)
  b = ContinuousBatcher(cfg, params, base=True, num_slots=2, cache_length=CACHE_LENGTH,
                        chunk_steps=8, eos_ids=(-1,))
  lengths = {0: 3, 2: 20, 4: 5}                      # prompt index -> max_new_tokens
  ids = {b.submit(Request(PROMPTS[i], n)): i for i, n in lengths.items()}
  tokens = {rid: [] for rid in ids}

  def step():
    events = b.step()
    for e in events:
      tokens[e.request_id] += e.new_tokens
    return {ids[e.request_id] for e in events if e.finished}

  assert step() == {0} and int(b.state.iteration) == 3    # not 8: request 4 was waiting
  assert step() == {4} and int(b.state.iteration) == 3 + 8  # 4 admitted; nothing waits
  while b.has_work():
    step()
  base = Sampler(cfg, params, base=True, cache_length=CACHE_LENGTH)
  for rid, i in ids.items():
    alone = base.decode([PROMPTS[i]], max_new_tokens=lengths[i], eos_ids=[-1])
    assert tokens[rid] == alone.tokens[0], f"request {i}"


@pytest.mark.slow
def test_micro_policy_cuts_groups_only_when_asked():
  sampler = small_sampler(0)
  prompts = [PROMPTS[i] for i in (0, 2, 4, 6)]
  knobs = dict(max_new_tokens=24, confidence=0.85, eos_ids=[])
  every = sampler.decode(prompts, **knobs)
  assert sampler.decode(prompts, micro_policy="min_rows:1", **knobs).tokens == every.tokens
  assert sampler.decode(prompts, micro_policy="fraction:0", **knobs).tokens == every.tokens
  mean = lambda r: np.mean([s for sizes in r.group_sizes for s in sizes])
  sizes = [mean(sampler.decode(prompts, micro_policy=p, **knobs))
           for p in ("all", "fraction:0.5", "min_rows:4")]
  assert sizes[0] > sizes[1] > sizes[2] >= 1.0
