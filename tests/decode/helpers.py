"""Shared helpers of the decode tests: a small random model and sampler, and the check that a
decoded result reproduces under teacher forcing."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.decode import acceptance
from hamburger_jax.decode import state as ds
from hamburger_jax.decode.sampling import SamplingParams
from hamburger_jax.model.llama import LlamaModel
from hamburger_jax.model.batch import make_batch
from hamburger_jax.testing.fixtures import random_params, tiny_config
from hamburger_jax.model.hamburger import HamburgerModel
from hamburger_jax.decode.sampler import Sampler, continue_probability

# One engine shared by most decode tests (one compile per batch bucket for the whole session).
CACHE_LENGTH = 32
OUT_LENGTH = 32
TF_SEQ_LEN = 64   # teacher-forced rows: prompt + groups - 1 <= 17 + 32 - 1


@functools.lru_cache(maxsize=None)
def small_model(seed: int = 0):
  """(cfg, params): 4 base layers, tiny preset widths, stop head spread out (random_params)."""
  cfg = tiny_config(4)
  return cfg, random_params(cfg, seed)


@functools.lru_cache(maxsize=None)
def small_sampler(seed: int = 0, **kwargs) -> Sampler:
  """A shared sampler per setting (compiled functions are kept per sampler)."""
  cfg, params = small_model(seed)
  kwargs.setdefault("cache_length", CACHE_LENGTH)
  kwargs.setdefault("out_length", OUT_LENGTH)
  return Sampler(cfg, params, **kwargs)


@functools.lru_cache(maxsize=None)
def _tf_apply(cfg):
  return jax.jit(HamburgerModel(cfg).apply)


def teacher_forced(cfg, params, prompt, tokens, group_sizes):
  """The training forward on (prompt, tokens, steps) -> (logits [M, S, V], stop logits [M, S])."""
  batch = make_batch([(prompt, tokens, group_sizes)], cfg.max_steps, TF_SEQ_LEN, pack=False)
  out = _tf_apply(cfg)({"params": params}, batch)
  return np.asarray(out.logits[0]), np.asarray(out.stop_logits[0])


def check_against_teacher_forcing(cfg, params, prompt, result, row, confidence, max_group=None,
                                  greedy=True, eos_ids=(), min_token_prob=0.0):
  """Every decoded token, logit, stop logit and group boundary reproduces under teacher forcing.

  With min_token_prob > 0 (greedy only): every drafted token (step >= 1) has probability >= it,
  and a group the stop head would have continued ended because the next draft (the teacher-forced
  argmax after its last token) fell below it.
  Returns the number of checked stop decisions (so callers can insist on non-trivial cases).
  Decisions within 1e-5 of the threshold (and argmax near-ties within 1e-5) may go either way.
  """
  tokens, sizes = result.tokens[row], result.group_sizes[row]
  assert sum(sizes) == len(tokens) and all(1 <= s <= cfg.max_steps for s in sizes)
  logits, stops = teacher_forced(cfg, params, prompt, tokens, sizes)
  cap = cfg.max_steps if max_group is None else max_group
  truncated_last = result.finish_reasons[row] in ("eos", "length")
  t, i, decisions = len(prompt), 0, 0
  for g, size in enumerate(sizes):
    m = t - 1 + g                       # macro position that predicts group g
    for j in range(size):
      tok, tf = tokens[i], logits[m, j]
      if greedy:
        top = np.sort(tf)[-2:]
        assert tok == int(np.argmax(tf)) or (top[1] - top[0] < 1e-5 and tf[tok] >= top[1] - 1e-5), (
            f"group {g} step {j}: decoded {tok}, teacher-forced argmax {int(np.argmax(tf))}")
      np.testing.assert_allclose(result.logits[row][i], tf[tok], rtol=1e-4, atol=1e-4)
      np.testing.assert_allclose(result.stop_logits[row][i], stops[m, j], rtol=1e-4, atol=1e-4)
      np.testing.assert_allclose(result.logprobs[row][i], jax.nn.log_softmax(tf)[tok], atol=1e-4)
      if j >= 1 and min_token_prob > 0:
        assert np.exp(result.logprobs[row][i]) >= min_token_prob - 1e-5, (
            f"group {g} step {j}: a draft below min_token_prob was kept")
      go_on = float(continue_probability(jnp.float32(stops[m, j])))
      last = j == size - 1
      forced_end = (last and g == len(sizes) - 1 and truncated_last) or tok in eos_ids
      if abs(go_on - confidence) > 1e-5 and not forced_end:
        expect_go_on = not last
        if last and j + 1 >= cap:
          expect_go_on = None              # the cap ended the group, whatever the head says
        if last and expect_go_on is not None and go_on >= confidence and min_token_prob > 0:
          draft = float(np.max(jax.nn.softmax(logits[m, j + 1])))   # the dropped draft
          if abs(draft - min_token_prob) > 1e-5:
            assert draft < min_token_prob, f"group {g} ended after a trusted draft ({draft:.4f})"
            decisions += 1
          expect_go_on = None
        if expect_go_on is not None:
          assert (go_on >= confidence) == expect_go_on, (
              f"group {g} step {j}: continue-prob {go_on:.6f} vs confidence {confidence}")
          decisions += 1
      i += 1
  return decisions


@functools.lru_cache(maxsize=None)
def drafting_model(micro_scale: float = 0.3):
  """(cfg, params): small_model whose micro decoder drafts like the base often, but not always.

  The micro decoder's layers have their output projections scaled by `micro_scale` (0: a draft
  is the base's next-token choice for the token before it, before the context's effect), and
  the stop head always continues, so verified decoding sees a mix of accepted and rejected
  drafts of every index.
  """
  cfg, params = small_model(0)

  def adjust(path, x):
    key = jax.tree_util.keystr(path)
    if "micro_decoder" in key and ("o_proj" in key or "down_proj" in key):
      return x * micro_scale
    if "stop_head" in key and "dense_2" in key and "bias" in key:
      return x - 20.0
    return x

  return cfg, jax.tree_util.tree_map_with_path(adjust, params)


@functools.lru_cache(maxsize=None)
def _last_probs(base_cfg):
  """jit of (base params, tokens [1, T], sampling) -> the processed probs after tokens [1, V]."""

  def probs(params, tokens, sampling):
    logits = LlamaModel(base_cfg).apply({"params": params}, tokens).logits[:, -1]
    return acceptance.processed_probs(logits.astype(jnp.float32), sampling)

  return jax.jit(probs)


def base_pair_probs(cfg, params, prompt, top_k):
  """Exact P(t1, t2) of sampling the base at temperature 1 with top-k: {(t1, t2): prob}."""
  sampling = SamplingParams(jnp.ones((1,)), jnp.full((1,), top_k), jnp.ones((1,)))

  def dist(tokens):
    return np.asarray(_last_probs(cfg.base)(params["base"], jnp.asarray([tokens]), sampling)[0])

  out = {}
  p1 = dist(prompt)
  for t1 in np.flatnonzero(p1):
    p2 = dist(prompt + [int(t1)])
    for t2 in np.flatnonzero(p2):
      out[(int(t1), int(t2))] = p1[t1] * p2[t2]
  return out
