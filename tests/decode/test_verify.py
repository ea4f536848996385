"""Verified decoding (decode/verify.py): the base checks the drafts; the answer is the base's."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

from hamburger_jax.decode import loop as lp
from hamburger_jax.decode import state as ds
from hamburger_jax.decode import acceptance, verify
from hamburger_jax.decode.batching import ContinuousBatcher, Request
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.decode.sampling import SamplingParams
from tests.decode.helpers import CACHE_LENGTH, OUT_LENGTH, base_pair_probs, drafting_model

PROMPTS = [[1, 5, 7], [3, 9, 11, 2, 4], [7], [8, 8, 8, 8], [2] * 20, [100, 3], [17] * 9,
           [200, 201, 202]]


@functools.lru_cache(maxsize=None)
def _samplers():
  cfg, params = drafting_model()
  base = Sampler(cfg, params, base=True, cache_length=CACHE_LENGTH, out_length=OUT_LENGTH)
  verified = Sampler(cfg, params, cache_length=CACHE_LENGTH, out_length=OUT_LENGTH, verify=True)
  return base, verified


@pytest.mark.parametrize("rows, confidence", [
    (1, 0.5), pytest.param(8, 0.5, marks=pytest.mark.slow),
    pytest.param(1, 0.97, marks=pytest.mark.slow), pytest.param(8, 0.97, marks=pytest.mark.slow)])
def test_verified_greedy_is_the_base_token_for_token(rows, confidence):
  base, verified = _samplers()
  prompts = PROMPTS[:rows]
  want = base.decode(prompts, max_new_tokens=24)
  got = verified.decode(prompts, max_new_tokens=24, confidence=confidence)
  assert got.tokens == want.tokens
  assert got.finish_reasons == want.finish_reasons
  assert got.prompt_lengths == [len(p) for p in prompts]
  st = got.stats()
  assert st["kv_slots_used"] == st["kv_slots_base"]
  reached, accepted = got.draft_counts
  assert sum(accepted) > 0 and sum(accepted) < sum(reached)     # drafts accepted AND rejected
  assert st["tokens_per_forward"] == pytest.approx(st["new_tokens"] / sum(got.macro_steps))
  if confidence == 0.5:
    assert st["tokens_per_forward"] > 1.3
  # Every forward's tokens are one group: the accepted drafts plus the base's own token.
  for r in range(rows):
    assert sum(got.group_sizes[r]) == len(got.tokens[r])
    assert all(1 <= g <= 4 for g in got.group_sizes[r])


@pytest.mark.slow
def test_verified_decoding_ends_at_eos_stop_ids_and_budget_as_the_base():
  base, verified = _samplers()
  ref = base.decode(PROMPTS, max_new_tokens=24)
  eos = ref.tokens[1][5]                 # a token the base emits mid-answer
  stop = ref.tokens[4][7]
  want = base.decode(PROMPTS, max_new_tokens=13, eos_ids=[eos], stop_ids=[stop])
  got = verified.decode(PROMPTS, max_new_tokens=13, eos_ids=[eos], stop_ids=[stop],
                        confidence=0.5)
  assert got.tokens == want.tokens and got.finish_reasons == want.finish_reasons
  assert "eos" in got.finish_reasons and "length" in got.finish_reasons


@pytest.mark.slow
def test_verified_decoding_fills_the_buffer_as_the_base():
  cfg, params = drafting_model()
  base = Sampler(cfg, params, base=True, cache_length=24, out_length=32)
  verified = Sampler(cfg, params, cache_length=24, out_length=32, verify=True)
  prompts = [[2] * 20, [5, 6]]
  want = base.decode(prompts, max_new_tokens=30)
  got = verified.decode(prompts, max_new_tokens=30, confidence=0.5)
  assert got.tokens == want.tokens and got.finish_reasons == want.finish_reasons
  assert got.finish_reasons[0] == "buffer_full"


def test_knobs_never_recompile_the_verified_loop():
  _, verified = _samplers()
  verified.decode(PROMPTS, max_new_tokens=8, confidence=0.5)
  before = dict(lp.TRACE_COUNTS)
  for knobs in (dict(confidence=0.9), dict(confidence=0.3, temperature=0.7, top_k=5, seed=3),
                dict(confidence=0.5, min_token_prob=0.2, max_group=2)):
    verified.decode(PROMPTS, max_new_tokens=12, **knobs)
  assert dict(lp.TRACE_COUNTS) == before


@pytest.mark.slow
def test_streaming_yields_the_same_answer():
  _, verified = _samplers()
  whole = verified.decode(PROMPTS[:2], max_new_tokens=20, confidence=0.5)
  chunks = list(verified.stream(PROMPTS[:2], max_new_tokens=20, confidence=0.5, chunk_steps=2))
  assert chunks[-1].tokens == whole.tokens and len(chunks) > 1


@pytest.mark.slow
def test_rejected_drafts_kv_entries_never_influence_later_tokens():
  """Poisons every KV slot at and after each row's next write slot (rejected drafts' entries
  among them) after every verified step: the answer does not change."""
  base, verified = _samplers()
  engine = verified.engine

  def poisoned_step(params, st):
    st = verify.verify_step(engine, params, st)
    slots = jnp.arange(engine.cache_length)[None, :, None]
    after = slots >= st.slot[:, None, None]
    poison = lambda x: jnp.where(after, jnp.asarray(1e4, x.dtype), x)
    return st.replace(cache=jax.tree_util.tree_map(poison, st.cache))

  def run(params, st):
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done), functools.partial(poisoned_step, params),
                              st)

  state, rows = verified.start(PROMPTS, max_new_tokens=24, confidence=0.5)
  host = ds.to_host(jax.jit(run)(verified.params, state))
  got = ds.DecodeResult.from_state(host, rows)
  assert got.tokens == base.decode(PROMPTS, max_new_tokens=24).tokens
  assert sum(got.draft_counts[1]) > 0


@pytest.mark.slow
def test_continuous_batching_verifies_each_request_as_alone():
  cfg, params = drafting_model()
  base, _ = _samplers()
  batcher = ContinuousBatcher(cfg, params, num_slots=4, cache_length=CACHE_LENGTH,
                              chunk_steps=3, verify=True)
  lengths = [5, 17, 9, 24, 3, 12, 20, 8]
  done = batcher.generate([Request(prompt_ids=p, max_new_tokens=n, confidence=0.5)
                           for p, n in zip(PROMPTS, lengths)])
  for c, p, n in zip(done, PROMPTS, lengths):
    assert c.tokens == base.decode([p], max_new_tokens=n).tokens[0]
  assert any(max(c.group_sizes) > 1 for c in done)      # drafts were accepted


@pytest.mark.parametrize("steps", [2, pytest.param(6, marks=pytest.mark.slow)])
def test_any_verify_depth_is_the_base_token_for_token(steps):
  """verify_steps S: up to S tokens a forward (S - 1 drafts; the model's own S is 4), the
  answers still the base's; at 6 some forward commits more than 4, also under continuous
  batching (whose buffers keep S - 1 spare slots)."""
  cfg, params = drafting_model()
  base, _ = _samplers()
  verified = Sampler(cfg, params, cache_length=CACHE_LENGTH, out_length=OUT_LENGTH, verify=True,
                     verify_steps=steps)
  got = verified.decode(PROMPTS, max_new_tokens=24, confidence=0.001, min_token_prob=0.0)
  assert got.tokens == base.decode(PROMPTS, max_new_tokens=24).tokens
  sizes = [g for row in got.group_sizes for g in row]
  assert max(sizes) <= steps and len(got.draft_counts[0]) == steps - 1
  assert max(sizes) == steps if steps == 2 else max(sizes) > 4
  if steps == 2:
    return                   # the batcher at depth 4: test_continuous_batching_verifies_...
  batcher = ContinuousBatcher(cfg, params, num_slots=3, cache_length=CACHE_LENGTH,
                              chunk_steps=2, verify=True, verify_steps=steps)
  done = batcher.generate([Request(prompt_ids=p, max_new_tokens=24, confidence=0.001)
                           for p in PROMPTS[:5]])
  assert [c.tokens for c in done] == got.tokens[:5]


def test_verify_steps_is_refused_without_verified_decoding_or_out_of_range():
  cfg, params = drafting_model()
  with pytest.raises(ValueError, match="verify=True"):
    Sampler(cfg, params, cache_length=CACHE_LENGTH, verify_steps=6)
  with pytest.raises(ValueError, match="2..16"):
    Sampler(cfg, params, cache_length=CACHE_LENGTH, verify=True, verify_steps=1)


# --- the acceptance rules on known distributions --------------------------------------------------

def test_accept_greedy_takes_the_longest_agreeing_prefix():
  v = 6
  argmax = np.array([[2, 3, 4, 5], [1, 1, 1, 1]])            # the base's choice after each input
  logits = jax.nn.one_hot(argmax, v) * 5.0
  pending = jnp.array([[9, 2, 3, 0], [9, 1, 4, 1]])
  accepted, nxt, flags = acceptance.accept_greedy(logits, pending, jnp.array([3, 3]))
  assert accepted.tolist() == [2, 1] and nxt.tolist() == [4, 1]
  assert flags.tolist() == [[True, True, False], [True, False, False]]
  accepted, nxt, _ = acceptance.accept_greedy(logits, pending, jnp.array([1, 0]))
  assert accepted.tolist() == [1, 0] and nxt.tolist() == [3, 1]    # drafts beyond k never count


def test_accept_sampled_follows_the_rule():
  v = 4
  p0 = jnp.array([[0.5, 0.5, 0.0, 0.0], [0.25] * 4, [0.25] * 4])      # the base after input 0
  p = jnp.stack([p0, jnp.full((3, v), 0.25)], axis=1)                  # [3, S=2, V]
  q = jnp.zeros((3, 2, v))
  q = q.at[0, 1].set(jnp.array([0.5, 0.5, 0.0, 0.0]))   # q == p: always accepted
  q = q.at[1, 1].set(jnp.array([0.0, 0.0, 1.0, 0.0]))   # q(d) = 1 > p(d): accepted w.p. 1/4
  q = q.at[2, 1].set(jnp.array([0.0, 0.0, 1.0, 0.0]))
  pending = jnp.array([[7, 1], [7, 2], [7, 2]])
  counts = np.zeros(v)
  for seed in range(200):
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(seed), i))(jnp.arange(3))
    accepted, nxt, _ = acceptance.accept_sampled(p, q, pending, jnp.array([1, 1, 0]), keys)
    assert int(accepted[0]) == 1 and int(accepted[2]) == 0      # no draft: nothing to accept
    if int(accepted[1]) == 0:
      counts[int(nxt[1])] += 1                                  # the residual max(p - q, 0)
  assert counts[2] == 0 and counts[[0, 1, 3]].min() > 20        # never the rejected draft
  assert 200 - counts.sum() == pytest.approx(50, abs=25)        # ~1/4 accepted


def test_accept_sampled_reads_a_draft_vocabulary_as_its_spread_distribution():
  """q over a draft vocabulary (q_k [B, S, K], ids [K]) decides as q spread over all V ids."""
  v, ids = 12, jnp.array([9, 2, 5, 0, 7])
  ks = jax.random.split(jax.random.PRNGKey(3), 3)
  p = jax.nn.softmax(jax.random.normal(ks[0], (4, 3, v)), axis=-1)
  q_k = jax.nn.softmax(2.0 * jax.random.normal(ks[1], (4, 3, ids.size)), axis=-1)
  q = jnp.zeros((4, 3, v)).at[:, :, ids].set(q_k)
  pending = jnp.concatenate([jnp.full((4, 1), 3), ids[jax.random.randint(ks[2], (4, 2), 0, 5)]],
                            axis=1)
  outcomes = set()
  for seed in range(40):
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(seed), i))(jnp.arange(4))
    full = acceptance.accept_sampled(p, q, pending, jnp.array([2, 2, 1, 0]), keys)
    compact = acceptance.accept_sampled(p, (q_k, ids), pending, jnp.array([2, 2, 1, 0]), keys)
    for a, b in zip(full, compact):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    outcomes.update(int(a) for a in full[0])
  assert outcomes == {0, 1, 2}                       # rejections and acceptances both seen


def test_accept_sampled_checks_fixed_drafts_as_drafts_of_a_one_hot_q():
  """Rows whose drafts were chosen, not drawn (lookup drafts: fixed), decide exactly as with q
  one-hot at each draft, also over a draft vocabulary that lacks the draft."""
  v, ids = 12, jnp.array([9, 2, 5, 0, 7])
  ks = jax.random.split(jax.random.PRNGKey(4), 4)
  p = jax.nn.softmax(jax.random.normal(ks[0], (4, 3, v)), axis=-1)
  q_k = jax.nn.softmax(2.0 * jax.random.normal(ks[1], (4, 3, ids.size)), axis=-1)
  pending = jax.random.randint(ks[2], (4, 3), 0, v)                 # any token, in ids or not
  fixed, num_drafts = jnp.array([True, False, True, True]), jnp.array([2, 2, 1, 0])
  spread = jnp.zeros((4, 3, v)).at[:, :, ids].set(q_k)
  one_hot = jnp.where(fixed[:, None, None], jax.nn.one_hot(pending, v), spread)
  outcomes = set()
  for seed in range(40):
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(seed), i))(jnp.arange(4))
    want = acceptance.accept_sampled(p, one_hot, pending, num_drafts, keys)
    for q in (spread, (q_k, ids)):
      got = acceptance.accept_sampled(p, q, pending, num_drafts, keys, fixed)
      for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    outcomes.update(int(a) for a in want[0][:2])
  assert outcomes == {0, 1, 2}                       # rejections and acceptances both seen


def test_processed_probs_are_one_hot_for_greedy_rows():
  logits = jnp.array([[0.0, 2.0, 1.0], [0.0, 2.0, 1.0]])
  sampling = SamplingParams(jnp.array([0.0, 1.0]), jnp.array([0, 2]), jnp.array([1.0, 1.0]))
  probs = acceptance.processed_probs(logits, sampling)
  np.testing.assert_allclose(probs[0], [0, 1, 0])
  np.testing.assert_allclose(probs[1], [0, np.e / (np.e + 1), 1 / (np.e + 1)], rtol=1e-5)


# --- sampling: the base's distribution --------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("branches", [1, 2])
def test_verified_sampling_reproduces_the_base_distribution(branches):
  """Chi-square goodness of fit of the first two tokens (the second one is a verified draft or
  the rule's residual draw) against the base's exact distribution, 4096 samples, p > 1e-3.
  The same test rejects HAMburger's own (unverified) sampling, so it has the power to fail
  (checked once: it does not depend on branches). With a draft tree (branches 2) sampled rows
  check its first chain."""
  cfg, params = drafting_model(0.6)
  prompt, top_k, n = [3, 9, 11], 3, 4096
  exact = base_pair_probs(cfg, params, prompt, top_k)
  keys = sorted(exact)

  def p_value(sampler, **knobs):
    # 3 tokens: the forward after the first token may then check one draft (the budget allows it).
    counts, drafted = dict.fromkeys(keys, 0), np.zeros(2, int)
    for seed in range(n // 1024):
      result = sampler.decode([prompt] * 1024, max_new_tokens=3, temperature=1.0, top_k=top_k,
                              seed=seed, confidence=0.3, eos_ids=[], **knobs)
      for t in result.tokens:
        if tuple(t[:2]) not in counts:
          return 0.0                       # a pair the base never samples
        counts[tuple(t[:2])] += 1
      if result.verified:                  # [drafts reached, accepted] at draft index 1
        drafted += np.asarray(result.draft_counts)[:, 0]
    if sampler.engine.verify:
      assert drafted[0] == n and 0.02 * n < drafted[1] < 0.9 * n, drafted   # the rule decides
    observed = np.array([counts[k] for k in keys], float)
    expected = np.array([exact[k] for k in keys], float)
    expected *= observed.sum() / expected.sum()
    return scipy_stats.chisquare(observed, expected).pvalue

  verified = Sampler(cfg, params, cache_length=16, out_length=4, verify=True,
                     draft_branches=branches)
  assert p_value(verified) > 1e-3
  if branches == 1:
    # Micro steps on all rows (not gathered into buckets of continuing rows, 11 branches at
    # 1,024 rows): each row's tokens are the same, the loop compiles in a fraction of the time.
    merged = Sampler(cfg, params, cache_length=16, out_length=4, compact_micro_steps=False)
    assert p_value(merged, max_group=2) < 1e-6


def test_the_verified_loop_never_copies_a_kv_buffer():
  """The width branches only read the KV buffers and the step writes the new entries after the
  switch: XLA copies any buffer a switch branch updates in place (every buffer, twice a step)."""
  import re
  _, verified = _samplers()
  verified.decode(PROMPTS[:2], max_new_tokens=4, confidence=0.5)
  loops = [exe for (name, _), exe in verified.executables._compiled.items() if name == "loop"]
  assert loops
  cfg = verified.engine.model.llama
  width = cfg.num_kv_heads * cfg.head_dim
  for exe in loops:
    text = exe.as_text()
    shape = rf"f32\[\d+,(\d+),{width}\]"
    buffers = [n for n in re.findall(shape, text) if int(n) >= verified.engine.cache_length]
    copies = [n for n in re.findall(rf"= {shape}\{{2,1,0\}} copy\(", text)
              if int(n) >= verified.engine.cache_length]
    assert buffers, "the pattern must see the KV buffers"
    assert not copies, f"{len(copies)} copies of a KV buffer in the loop"
