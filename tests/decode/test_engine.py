"""The decode loop on a small random HAMburger model: teacher-forcing consistency, batching, EOS,
budgets, full buffers, seeds, streaming, and no recompilation across runtime settings."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hamburger_jax.decode import compaction
from hamburger_jax.decode import loop as loop_lib
from hamburger_jax.decode.sampler import DecodeInputError
from tests.decode.helpers import (CACHE_LENGTH, check_against_teacher_forcing, small_model,
                                small_sampler)

PROMPTS = [[1, 17, 33, 250, 4], [1, 9, 3, 120, 77, 5, 6, 200, 11], [42],
           [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]]


def _prompt(rng, length):
  return rng.integers(3, 256, length).tolist()


@settings(max_examples=10, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2), prompt_len=st.integers(1, 17), prompt_seed=st.integers(0, 10**6),
       confidence=st.floats(0.05, 1.0), max_new=st.integers(1, 32))
@pytest.mark.slow
def test_greedy_decode_matches_teacher_forced_forward(seed, prompt_len, prompt_seed, confidence,
                                                      max_new):
  cfg, params = small_model(seed)
  prompt = _prompt(np.random.default_rng(prompt_seed), prompt_len)
  r = small_sampler(seed).decode([prompt], max_new_tokens=max_new, confidence=confidence,
                                 eos_ids=[])
  assert len(r.tokens[0]) == max_new and r.finish_reasons == ["length"]
  check_against_teacher_forcing(cfg, params, prompt, r, 0, confidence)


@pytest.mark.slow
def test_consistency_covers_long_and_short_groups():
  cfg, params = small_model(0)
  sampler = small_sampler(0)
  decisions, sizes = 0, []
  for confidence in (0.2, 0.5, 0.8):
    r = sampler.decode(PROMPTS[:2], max_new_tokens=32, confidence=confidence, eos_ids=[])
    for row, prompt in enumerate(PROMPTS[:2]):
      decisions += check_against_teacher_forcing(cfg, params, prompt, r, row, confidence)
      sizes += r.group_sizes[row]
  assert decisions > 20 and min(sizes) == 1 and max(sizes) == cfg.max_steps
  assert 1.2 < np.mean(sizes) < cfg.max_steps


def test_sampled_decode_matches_teacher_forced_forward():
  cfg, params = small_model(1)
  r = small_sampler(1).decode(PROMPTS[:2], max_new_tokens=32, confidence=0.6, temperature=1.0,
                              top_k=50, top_p=0.95, seed=3, eos_ids=[])
  for row, prompt in enumerate(PROMPTS[:2]):
    check_against_teacher_forcing(cfg, params, prompt, r, row, 0.6, greedy=False)


def test_group_cap_limits_group_sizes():
  cfg, params = small_model(0)
  r = small_sampler(0).decode(PROMPTS[:2], max_new_tokens=32, confidence=0.1, max_group=2,
                              eos_ids=[])
  assert max(max(s) for s in r.group_sizes) == 2
  for row, prompt in enumerate(PROMPTS[:2]):
    check_against_teacher_forcing(cfg, params, prompt, r, row, 0.1, max_group=2)


def test_batch_rows_decode_as_each_row_alone():
  sampler = small_sampler(0)
  knobs = dict(max_new_tokens=24, confidence=0.5, eos_ids=[])
  batch = sampler.decode(PROMPTS, **knobs)
  for row, prompt in enumerate(PROMPTS):
    alone = sampler.decode([prompt], **knobs)
    assert batch.tokens[row] == alone.tokens[0]
    assert batch.group_sizes[row] == alone.group_sizes[0]
    assert batch.finish_reasons[row] == alone.finish_reasons[0]
    np.testing.assert_allclose(batch.logits[row], alone.logits[0], atol=1e-5)
  assert batch.prompt_lengths == [len(p) for p in PROMPTS]
  assert batch.iterations == max(batch.macro_steps)


def test_eos_inside_a_group_cuts_the_group():
  sampler = small_sampler(0)
  free = sampler.decode([PROMPTS[1]], max_new_tokens=32, confidence=0.2, eos_ids=[])
  groups = free.groups(0)
  # An EOS candidate: a non-first token of some group that does not occur earlier in the output.
  cut = None
  for g, group in enumerate(groups):
    for j in range(1, len(group) - 1 if g < len(groups) - 1 else len(group)):
      if group[j] not in free.tokens[0][:sum(map(len, groups[:g])) + j]:
        cut = (g, j)
        break
    if cut:
      break
  assert cut is not None, f"no usable group in {groups}"
  g, j = cut
  eos = groups[g][j]
  r = sampler.decode([PROMPTS[1]], max_new_tokens=32, confidence=0.2, eos_ids=[eos])
  end = sum(map(len, groups[:g])) + j + 1
  assert r.tokens[0] == free.tokens[0][:end] and r.tokens[0][-1] == eos
  assert r.groups(0) == groups[:g] + [groups[g][:j + 1]]
  assert r.finish_reasons == ["eos"]


def test_max_new_tokens_is_exact_and_truncates_the_last_group():
  sampler = small_sampler(0)
  full = sampler.decode([PROMPTS[0]], max_new_tokens=32, confidence=0.2, eos_ids=[])
  assert max(full.group_sizes[0]) > 1
  for n in (1, 2, 3, 5, 8, 13, 31):
    r = sampler.decode([PROMPTS[0]], max_new_tokens=n, confidence=0.2, eos_ids=[])
    assert r.tokens[0] == full.tokens[0][:n] and r.finish_reasons == ["length"]
    sizes = r.group_sizes[0]
    assert sizes[:-1] == full.group_sizes[0][:len(sizes) - 1]
    assert sizes[-1] <= full.group_sizes[0][len(sizes) - 1]


def test_full_kv_buffer_stops_the_row_with_its_reason():
  sampler = small_sampler(0)
  prompt = list(range(3, 3 + CACHE_LENGTH - 4))            # slots T-1 .. L-1 are left: 5 steps
  short = sampler.decode([prompt, PROMPTS[2]], max_new_tokens=32, confidence=1.0, eos_ids=[])
  assert short.macro_steps[0] == 5 and short.tokens[0] and short.group_sizes[0] == [1] * 5
  assert short.finish_reasons == ["buffer_full", "length"]
  long = sampler.decode([prompt], max_new_tokens=32, confidence=0.05, eos_ids=[])
  assert long.macro_steps == [5] and len(long.tokens[0]) > 5
  assert long.finish_reasons == ["buffer_full"]
  with pytest.raises(DecodeInputError, match="KV buffer holds 32 slots"):
    sampler.decode([list(range(CACHE_LENGTH + 1))], max_new_tokens=4)


def test_same_seed_same_sample_different_seed_different_sample():
  sampler = small_sampler(0)
  knobs = dict(max_new_tokens=32, confidence=0.5, temperature=1.0, eos_ids=[])
  a = sampler.decode(PROMPTS[:2], seed=11, **knobs)
  b = sampler.decode(PROMPTS[:2], seed=11, **knobs)
  c = sampler.decode(PROMPTS[:2], seed=12, **knobs)
  greedy = sampler.decode(PROMPTS[:2], max_new_tokens=32, confidence=0.5, eos_ids=[])
  assert a.tokens == b.tokens and a.group_sizes == b.group_sizes
  for row in range(2):
    assert a.tokens[row] != c.tokens[row]
    assert sum(x != y for x, y in zip(a.tokens[row], c.tokens[row])) > 8
  assert a.tokens != greedy.tokens
  # top-k 1 and a tiny nucleus keep only the argmax: sampling reduces to greedy.
  for extra in (dict(top_k=1), dict(top_p=1e-6)):
    r = sampler.decode(PROMPTS[:2], seed=11, **knobs, **extra)
    assert r.tokens == greedy.tokens


def test_streaming_yields_chunks_and_the_same_result():
  sampler = small_sampler(0)
  knobs = dict(max_new_tokens=30, confidence=0.5, eos_ids=[], temperature=0.8, seed=5)
  whole = sampler.decode(PROMPTS[:2], **knobs)
  chunks = list(sampler.stream(PROMPTS[:2], chunk_steps=3, **knobs))
  assert len(chunks) >= whole.iterations // 3
  for earlier, later in zip(chunks, chunks[1:]):
    for row in range(2):
      assert later.tokens[row][:len(earlier.tokens[row])] == earlier.tokens[row]
  assert chunks[-2].finish_reasons != whole.finish_reasons or len(chunks) == 1
  assert chunks[-1].tokens == whole.tokens and chunks[-1].group_sizes == whole.group_sizes
  assert chunks[-1].finish_reasons == whole.finish_reasons


@pytest.mark.slow
def test_no_recompilation_across_prompts_and_runtime_settings():
  # A buffer length no other test uses, so this engine starts uncompiled.
  sampler = small_sampler(0, cache_length=40, out_length=24)
  before = dict(loop_lib.TRACE_COUNTS)
  runs = [
      dict(prompts=[PROMPTS[0]], max_new_tokens=24, confidence=0.8),
      dict(prompts=[PROMPTS[1]], max_new_tokens=5, confidence=0.3),
      dict(prompts=[PROMPTS[3]], max_new_tokens=17, confidence=1.0, temperature=0.7, seed=4),
      dict(prompts=[PROMPTS[2]], max_new_tokens=9, confidence=0.5, temperature=1.3, top_k=7,
           top_p=0.9, max_group=2, eos_ids=[5, 6]),
  ]
  outputs = []
  for run in runs:
    outputs.append(sampler.decode(run.pop("prompts"), **run))
  traced = {k: loop_lib.TRACE_COUNTS[k] - before.get(k, 0) for k in ("prefill", "loop")}
  assert traced == {"prefill": 1, "loop": 1}
  assert outputs[0].compile_s > 0 and all(o.compile_s == 0 for o in outputs[1:])
  assert [len(o.tokens[0]) for o in outputs[:3]] == [24, 5, 17]
  # A different batch bucket compiles once more; a different prompt bucket only the prefill.
  sampler.decode(PROMPTS[:2], max_new_tokens=3)
  sampler.decode([list(range(3, 30))], max_new_tokens=3)
  traced = {k: loop_lib.TRACE_COUNTS[k] - before.get(k, 0) for k in ("prefill", "loop")}
  assert traced == {"prefill": 3, "loop": 2}


@pytest.mark.slow
def test_jit_cache_key_ignores_runtime_values():
  """Without the AOT cache: plain jax.jit of the loop traces once for different knob values."""
  sampler = small_sampler(0)
  # A fresh wrapper: jax keys its trace cache on the function, so nothing is cached yet.
  loop = jax.jit(lambda *args: loop_lib.loop(*args), static_argnums=0)
  before = loop_lib.TRACE_COUNTS["loop"]
  for confidence, n, temperature in ((0.9, 4, 0.0), (0.3, 7, 1.0), (0.6, 2, 0.5)):
    state, _ = sampler.start([PROMPTS[0]], max_new_tokens=n, confidence=confidence,
                             temperature=temperature)
    out = loop(sampler.engine, sampler.params, state, np.int32(1000))
    assert int(out.num_out[0]) == n
  assert loop_lib.TRACE_COUNTS["loop"] - before == 1


@pytest.mark.parametrize("prompts, knobs, message", [
    ([], {}, "No prompts"),
    ([[]], {}, "Prompt 0 is empty"),
    ([[1, 2], [3, 256]], {}, "token id 256 outside the vocabulary"),
    ([[1, -1]], {}, "token id -1"),
    ([[1]], dict(confidence=0.0), "confidence must be in"),
    ([[1]], dict(confidence=1.5), "confidence must be in"),
    ([[1]], dict(max_new_tokens=0), "max_new_tokens must be in 1..32"),
    ([[1]], dict(max_new_tokens=33), "max_new_tokens must be in 1..32"),
    ([[1]], dict(max_group=5), "max_group must be in 1..4"),
    ([[1]], dict(temperature=-1.0), "temperature"),
    ([[1]], dict(top_p=0.0), "top_p"),
])
def test_bad_input_is_rejected_before_compiling(prompts, knobs, message):
  knobs = {"max_new_tokens": 4, **knobs}
  with pytest.raises(DecodeInputError, match=message):
    small_sampler(0).decode(prompts, **knobs)


def test_the_loop_updates_its_state_in_place():
  """The state (KV buffers included) is donated on every backend: no copy per loop call."""
  sampler = small_sampler(0)
  state, _ = sampler.start([PROMPTS[0]], max_new_tokens=4)
  out = sampler.run(state)
  assert state.cache[0]["k"].is_deleted() and not out.cache[0]["k"].is_deleted()
  assert int(out.num_out[0]) == 4


def test_tpu_plans_trace_the_engine_a_tpu_runs():
  """A TPU plan is traced on this CPU: it must not take the CPU's default (unmerged work skipped
  by a branch) nor compact micro steps into row buckets, which a TPU never runs and which XLA
  TPU compiled into whole-kernel converts (1B int8:32z HAMburger step at batch 8)."""
  from hamburger_jax.train import aot
  model = small_sampler(0).engine.model
  on_this_cpu = loop_lib.DecodeEngine(model, CACHE_LENGTH, CACHE_LENGTH)
  assert compaction.skips_unmerged(on_this_cpu)
  planned = aot.tpu_decode_engine(model, CACHE_LENGTH, verify=False)
  assert compaction.micro_buckets(planned, 8) == (8,)
  assert compaction.micro_buckets(planned, 64) == (64,)
  assert not compaction.skips_unmerged(planned)


@pytest.mark.slow
def test_compacted_micro_steps_give_each_row_the_same_numbers():
  """At 8 rows micro steps run on the continuing rows only, gathered into 1/2/4/8-row buckets."""
  compact = small_sampler(0, compact_micro_steps=True)
  full = small_sampler(0, compact_micro_steps=False)
  assert compaction.micro_buckets(compact.engine, 8) == (1, 2, 4, 8)
  assert compaction.micro_buckets(full.engine, 8) == (8,)
  default = small_sampler(0).engine                  # off by default: one bucket, the batch
  assert compaction.micro_buckets(default, 8) == (8,)
  assert compaction.micro_buckets(default, 32) == (32,)
  assert compaction.micro_buckets(default, 4) == (4,)
  assert compaction.micro_buckets(compact.engine, 32) == (1, 2, 4, 8, 16, 32)
  assert compaction.micro_buckets(compact.engine, 24) == (1, 2, 4, 8, 16, 24)
  prompts = PROMPTS * 2
  for knobs in (dict(confidence=0.5), dict(confidence=0.3, temperature=1.0, top_k=40, seed=5)):
    a = compact.decode(prompts, max_new_tokens=24, eos_ids=[], **knobs)
    b = full.decode(prompts, max_new_tokens=24, eos_ids=[], **knobs)
    assert a.tokens == b.tokens and a.group_sizes == b.group_sizes
    assert max(max(s) for s in a.group_sizes) > 1 and min(min(s) for s in a.group_sizes) == 1
    for row in range(len(prompts)):
      np.testing.assert_allclose(a.logits[row], b.logits[row], atol=1e-5)
