"""Token selection: greedy, temperature, top-k, top-p filters and their traced knobs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hamburger_jax.decode.sampling import (SamplingParams, filter_logits, greedy_tokens,
                                           sample_tokens, token_log_probs)

LOGITS = jnp.log(jnp.array([[0.5, 0.2, 0.15, 0.1, 0.05],
                            [0.05, 0.1, 0.15, 0.2, 0.5]], jnp.float32))


def _kept(logits, top_k, top_p):
  return np.isfinite(np.asarray(filter_logits(logits, jnp.int32(top_k), jnp.float32(top_p))))


def test_top_k_keeps_the_k_largest():
  np.testing.assert_array_equal(_kept(LOGITS, 2, 1.0),
                                [[1, 1, 0, 0, 0], [0, 0, 0, 1, 1]])
  assert _kept(LOGITS, 0, 1.0).all() and _kept(LOGITS, 99, 1.0).all()


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
  # 0.5 < 0.6 needs a second token; 0.5 + 0.2 = 0.7 >= 0.6 stops there.
  np.testing.assert_array_equal(_kept(LOGITS, 0, 0.6), [[1, 1, 0, 0, 0], [0, 0, 0, 1, 1]])
  np.testing.assert_array_equal(_kept(LOGITS, 0, 0.5), [[1, 0, 0, 0, 0], [0, 0, 0, 0, 1]])
  np.testing.assert_array_equal(_kept(LOGITS, 0, 0.86), [[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]])
  # top-p on the renormalised top-k distribution: within top-2, 0.5/0.7 = 0.71 < 0.75.
  np.testing.assert_array_equal(_kept(LOGITS, 2, 0.75), [[1, 1, 0, 0, 0], [0, 0, 0, 1, 1]])
  np.testing.assert_array_equal(_kept(LOGITS, 3, 0.7), [[1, 1, 0, 0, 0], [0, 0, 0, 1, 1]])


def test_greedy_is_argmax_without_randomness():
  logits = jax.random.normal(jax.random.PRNGKey(0), (6, 50))
  for seed in range(3):
    out = sample_tokens(logits, jax.random.PRNGKey(seed), SamplingParams.greedy())
    np.testing.assert_array_equal(out, np.argmax(logits, -1))


def test_greedy_tokens_are_argmax_with_ties_infinities_and_nans():
  """The CPU form (the first index where the max is met) picks what jnp.argmax picks: the
  first of tied maxima, index 0 of an all -inf row, the first NaN, +inf."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(5, 3, 1000)).astype(np.float32)
  x[0, 0, [7, 9]] = 50.0
  x[1, 1, :] = -np.inf
  x[2, 2, [11, 400]] = np.nan
  x[3, 0, 999] = np.inf
  for fn in (greedy_tokens, jax.jit(greedy_tokens)):
    got = np.asarray(fn(jnp.asarray(x)))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.argmax(x, -1))
  assert (got[0, 0], got[1, 1], got[2, 2], got[3, 0]) == (7, 0, 11, 999)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_temperature_sampling_follows_the_tempered_distribution(temperature):
  rows = 20000
  logits = jnp.broadcast_to(LOGITS[0], (rows, 5))
  tokens = sample_tokens(logits, jax.random.PRNGKey(1), SamplingParams.make(temperature))
  freq = np.bincount(np.asarray(tokens), minlength=5) / rows
  expected = np.asarray(jax.nn.softmax(LOGITS[0] / temperature))
  np.testing.assert_allclose(freq, expected, atol=0.015)


def test_filtered_sampling_never_leaves_the_nucleus_and_renormalises():
  rows = 20000
  logits = jnp.broadcast_to(LOGITS[0], (rows, 5))
  tokens = np.asarray(sample_tokens(logits, jax.random.PRNGKey(2),
                                    SamplingParams.make(1.0, top_k=3, top_p=0.9)))
  freq = np.bincount(tokens, minlength=5) / rows
  assert freq[3:].sum() == 0
  np.testing.assert_allclose(freq[:3], np.array([0.5, 0.2, 0.15]) / 0.85, atol=0.015)


def test_knobs_are_traced_one_compile_for_all_settings():
  traces = []

  @jax.jit
  def f(logits, key, params):
    traces.append(1)
    return sample_tokens(logits, key, params)

  logits = jax.random.normal(jax.random.PRNGKey(0), (4, 30))
  key = jax.random.PRNGKey(3)
  outs = [f(logits, key, SamplingParams.make(t, k, p))
          for t, k, p in ((0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 5, 1.0), (1.2, 0, 0.5))]
  assert len(traces) == 1
  np.testing.assert_array_equal(outs[0], np.argmax(logits, -1))


def test_token_log_probs():
  lp = token_log_probs(LOGITS, jnp.array([0, 4]))
  np.testing.assert_allclose(np.exp(lp), [0.5, 0.5], rtol=1e-6)


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(top_k=-1), dict(top_p=0.0),
                                    dict(top_p=1.5), dict(temperature=float("nan"))])
def test_bad_knobs_raise(kwargs):
  with pytest.raises(ValueError):
    SamplingParams.make(**kwargs)
