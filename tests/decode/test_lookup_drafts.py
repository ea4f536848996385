"""Lookup drafts for verified decoding (decode/lookup_drafts.py): a row's own earlier tokens."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

from hamburger_jax.decode import lookup_drafts
from hamburger_jax.decode.batching import ContinuousBatcher, Request
from hamburger_jax.decode.prompts import DecodeInputError
from hamburger_jax.decode.sampler import Sampler, row_keys
from hamburger_jax.decode.state import DecodeResult, to_host
from tests.decode.helpers import CACHE_LENGTH, OUT_LENGTH, base_pair_probs, drafting_model


def _reference(tokens, min_match, max_drafts):
  """The longest suffix (<= MAX_MATCH tokens) seen before, its latest occurrence, the tokens
  that followed it (up to the end), read off a Python list."""
  end = len(tokens)
  for n in range(lookup_drafts.MAX_MATCH, min_match - 1, -1):
    suffix = tokens[end - n:]
    for start in range(end - n - 1, -1, -1):
      if n <= end - 1 and tokens[start:start + n] == suffix:
        return tokens[start + n:start + n + max_drafts]
  return []


def test_propose_matches_a_plain_search():
  rng = np.random.default_rng(0)
  rows, length, cases = 6, 40, 0
  for trial in range(30):
    history = rng.integers(0, 3 + trial % 4, size=(rows, length))      # small vocabularies repeat
    end = rng.integers(0, length, size=rows)
    min_match = 1 + trial % 3
    drafts, count, found = lookup_drafts.propose(jnp.asarray(history, jnp.int32),
                                                 jnp.asarray(end, jnp.int32), min_match, 3)
    for r in range(rows):
      want = _reference(history[r, :end[r] + 1].tolist(), min_match, 3)
      assert bool(found[r]) == bool(want)
      assert np.asarray(drafts[r, :int(count[r])]).tolist() == want
      cases += bool(want)
  assert 0 < cases < 30 * rows                      # some rows find a match, some do not


def test_record_writes_each_rows_committed_tokens_after_its_slot():
  history = lookup_drafts.initial(12, jnp.asarray([[5, 6, 0], [7, 8, 9]]), jnp.asarray([1, 2]),
                                  jnp.asarray([3, 4]))
  assert history[:, :5].tolist() == [[5, 6, 1, 0, 0], [7, 8, 9, 2, 0]]
  history = lookup_drafts.record(history, jnp.asarray([2, 3]), jnp.asarray([[3, 4, 99], [5, 0, 0]]),
                                 jnp.asarray([2, 1]))
  assert history[:, :6].tolist() == [[5, 6, 1, 3, 4, 0], [7, 8, 9, 2, 5, 0]]


def test_take_replaces_the_micro_drafts_of_the_rows_that_use_lookup():
  tokens = jnp.asarray([[1, 10, 11, 12], [2, 20, 21, 0]])
  got, length, accept = lookup_drafts.take(
      jnp.asarray([True, False]), jnp.asarray([[7, 8, 9], [7, 8, 9]]), jnp.asarray([2, 3]),
      tokens, jnp.asarray([4, 3]), jnp.full((2, 4), 0.5))
  assert got.tolist() == [[1, 7, 8, 0], [2, 20, 21, 0]]
  assert length.tolist() == [3, 3]
  assert accept.tolist() == [[1.0] * 4, [0.5] * 4]


PROMPTS = [[1, 5, 7, 1, 5, 7, 1], [3, 9, 11, 2, 4], [7], [8, 8, 8, 8], [2] * 20, [100, 3],
           [17] * 9, [200, 201, 202, 200, 201]]


@functools.lru_cache(maxsize=None)
def _samplers():
  cfg, params = drafting_model()
  kw = dict(cache_length=CACHE_LENGTH, out_length=OUT_LENGTH)
  return (Sampler(cfg, params, base=True, **kw),
          {m: Sampler(cfg, params, verify=True, lookup_drafts=m, **kw) for m in (0, 1)})


def test_lookup_drafts_keep_the_base_answer_and_change_the_drafts():
  base, verified = _samplers()
  prompts = PROMPTS
  want = base.decode(prompts, max_new_tokens=24)
  counts = {}
  for m, sampler in verified.items():
    got = sampler.decode(prompts, max_new_tokens=24, confidence=0.5)
    # [2] * 20 fills the 32-slot buffer: no forward commits past where the base stops.
    assert got.tokens == want.tokens and got.finish_reasons == want.finish_reasons, m
    counts[m] = np.asarray(got.draft_counts)
  # Drafts looked up in the row's tokens replace the micro decoder's: other drafts are checked.
  assert not np.array_equal(counts[0], counts[1])
  assert verified[1].engine.lookup_drafts == 1 and verified[0].engine.lookup_drafts == 0


def test_the_default_is_on_for_verified_decoding_of_one_chain_only():
  cfg, params = drafting_model()
  kw = dict(cache_length=CACHE_LENGTH, out_length=OUT_LENGTH)
  assert Sampler(cfg, params, verify=True, **kw).engine.lookup_drafts == \
      lookup_drafts.DEFAULT_MIN_MATCH
  assert Sampler(cfg, params, **kw).engine.lookup_drafts == 0
  assert Sampler(cfg, params, verify=True, draft_branches=2, **kw).engine.lookup_drafts == 0
  for bad, message in [(dict(lookup_drafts=2), "add verify"),
                       (dict(verify=True, draft_branches=2, lookup_drafts=2), "one chain"),
                       (dict(verify=True, lookup_drafts=9), "0..8")]:
    with pytest.raises(DecodeInputError, match=message):
      Sampler(cfg, params, **kw, **bad)


@pytest.mark.slow
def test_sampled_rows_check_looked_up_drafts_and_keep_the_base_distribution():
  """Chi-square goodness of fit of the first two tokens against the base's exact distribution
  (top-3 sampling, 4096 samples, p > 1e-3), the second one a looked-up draft checked as a draft of
  a one-hot q, or the rule's residual draw. The prompt holds every token once (then 3, 9, 11), so
  every row finds its first token earlier and drafts by lookup, and each likely first token is
  followed there by the base's likeliest next one, so both outcomes are frequent. (Checked once:
  with the micro decoder's q in place of the one-hot one, the same test fails, p < 1e-6.)"""
  cfg, params = drafting_model(0.6)
  top_k, n, tail = 3, 4096, [3, 9, 11]
  order = [int(t) for t in np.random.RandomState(0).permutation(cfg.base.vocab_size)]
  pairs = base_pair_probs(cfg, params, order + tail, top_k)
  for t1 in sorted({a for a, _ in pairs}):
    t2 = max((b for a, b in pairs if a == t1), key=lambda b: pairs[(t1, b)])
    if t2 != t1 and t2 not in tail and t1 not in tail:
      order.remove(t2)
      order.insert(order.index(t1) + 1, t2)
  prompt = order + tail
  exact = base_pair_probs(cfg, params, prompt, top_k)
  follows = {t1: _reference(prompt + [t1], 1, 1)[0] for t1, _ in exact}    # each row's draft
  sampler = Sampler(cfg, params, cache_length=len(prompt) + 8, out_length=4, verify=True,
                    lookup_drafts=1)
  counts, looked_up, drafted = dict.fromkeys(exact, 0), 0, np.zeros(2, int)
  # One prefill of one row (the rows' keys are first used by the loop): each batch decodes 1,024
  # copies of it with the keys of its seed, as `decode([prompt] * 1024, .., seed=seed)` would
  # (every per-row leaf of the state leads with the row axis, batch-wide ones are scalars).
  prefilled, _ = sampler.start([prompt], max_new_tokens=3, temperature=1.0, top_k=top_k, seed=0,
                               confidence=0.3, eos_ids=[])
  rows = 1024
  for seed in range(n // rows):
    state = jax.tree_util.tree_map(lambda x: jnp.repeat(x, rows, 0) if x.ndim else jnp.copy(x),
                                   prefilled).replace(
        rng=row_keys(np.full(rows, seed), np.arange(rows)))
    result = DecodeResult.from_state(to_host(sampler.run(state)), rows)
    for t in result.tokens:
      counts[(t[0], t[1])] += 1
      looked_up += t[1] == follows[t[0]]
    drafted += np.asarray(result.draft_counts)[:, 0]
  assert drafted[0] == n                               # every row drafted once after its first token
  assert 0.05 * n < drafted[1] < 0.8 * n          # accepted and rejected both frequent
  assert looked_up == drafted[1]       # accepted: the looked-up draft; rejected: never drawn again
  keys = sorted(exact)
  observed = np.array([counts[k] for k in keys], float)
  expected = np.array([exact[k] for k in keys], float)
  expected *= observed.sum() / expected.sum()
  assert scipy_stats.chisquare(observed, expected).pvalue > 1e-3


def test_continuous_batching_keeps_each_slots_own_history():
  """Requests admitted into slots that earlier requests used decode as alone."""
  cfg, params = drafting_model()
  base, _ = _samplers()
  batcher = ContinuousBatcher(cfg, params, num_slots=2, cache_length=CACHE_LENGTH,
                              chunk_steps=3, verify=True, lookup_drafts=1)
  lengths = [9, 17, 5, 12, 20]
  done = batcher.generate([Request(prompt_ids=p, max_new_tokens=n, confidence=0.5)
                           for p, n in zip(PROMPTS, lengths)])
  for c, p, n in zip(done, PROMPTS, lengths):
    assert c.tokens == base.decode([p], max_new_tokens=n).tokens[0]
