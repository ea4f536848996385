"""Draft trees (decode/draft_tree.py): several chains of drafts checked in one verified forward."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hamburger_jax.decode import state as ds
from hamburger_jax.decode import verify
from hamburger_jax.decode.batching import ContinuousBatcher, Request
from hamburger_jax.decode.draft_tree import DraftTree, take_path
from hamburger_jax.decode.prompts import DecodeInputError
from hamburger_jax.decode.sampler import Sampler
from tests.decode.helpers import CACHE_LENGTH, OUT_LENGTH, drafting_model
from tests.decode.test_verify import PROMPTS, _samplers

KNOBS = dict(max_new_tokens=24, confidence=0.001, min_token_prob=0.0)


@functools.lru_cache(maxsize=None)
def _tree_sampler(branches: int = 2) -> Sampler:
  cfg, params = drafting_model()
  return Sampler(cfg, params, cache_length=CACHE_LENGTH, out_length=OUT_LENGTH, verify=True,
                 draft_branches=branches)


def test_tree_layout():
  tree = DraftTree(branches=2, steps=4)
  assert tree.size == 7
  np.testing.assert_array_equal(tree.depth, [0, 1, 2, 3, 1, 2, 3])
  np.testing.assert_array_equal(tree.parent, [0, 0, 1, 2, 0, 4, 5])
  np.testing.assert_array_equal(tree.ancestors[6], [0, 4, 5, 6])
  np.testing.assert_array_equal(tree.ancestors[2], [0, 1, 2, 2])
  want = np.zeros((7, 7), bool)
  for n, path in enumerate([[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 4], [0, 4, 5],
                            [0, 4, 5, 6]]):
    want[n, path] = True
  np.testing.assert_array_equal(tree.mask, want)
  np.testing.assert_array_equal(tree.chain_path(1), [0, 4, 5, 6])


def test_accept_greedy_takes_the_deepest_agreeing_path():
  tree = DraftTree(branches=2, steps=4)
  # x = 9; chain 0 drafts 1, 2, 3; chain 1 drafts 4, 5, 6 (node order 0..6).
  nodes = jnp.array([[9, 1, 2, 3, 4, 5, 6]] * 3)
  proposed = jnp.ones((3, 7), bool).at[2, 6].set(False)
  # The base's argmax after each node: row 0 agrees with chain 1 for two drafts, then says 7;
  # row 1 agrees with chain 0's first draft only and with chain 1's first; row 2 agrees with all
  # of chain 1, but its third draft was not proposed.
  greedy = jnp.array([[4, 8, 8, 8, 5, 7, 8],
                      [1, 8, 8, 8, 8, 8, 8],
                      [4, 8, 8, 8, 5, 6, 8]])
  best, accepted, nxt = tree.accept_greedy(jax.nn.one_hot(greedy, 10) * 5.0, nodes, proposed)
  np.testing.assert_array_equal(best, [5, 1, 5])
  np.testing.assert_array_equal(accepted, [2, 1, 2])
  np.testing.assert_array_equal(nxt, [7, 8, 6])
  np.testing.assert_array_equal(take_path(nodes, tree.path(best)), [[9, 4, 5, 5], [9, 1, 1, 1],
                                                                    [9, 4, 5, 5]])


@pytest.mark.parametrize("rows", [1, pytest.param(8, marks=pytest.mark.slow)])
def test_tree_verified_greedy_is_the_base_token_for_token(rows):
  base, chain = _samplers()
  prompts = PROMPTS[:rows]
  want = base.decode(prompts, max_new_tokens=24)
  got = _tree_sampler().decode(prompts, **KNOBS)
  assert got.tokens == want.tokens
  assert got.finish_reasons == want.finish_reasons
  st = got.stats()
  assert st["kv_slots_used"] == st["kv_slots_base"]    # one slot per committed token
  if rows == 8:   # the second chain is accepted where the first was not
    one_chain = chain.decode(prompts, **KNOBS).stats()["tokens_per_forward"]
    assert st["tokens_per_forward"] > one_chain


@pytest.mark.slow
def test_continuous_batching_with_a_tree_is_the_base():
  cfg, params = drafting_model()
  base, _ = _samplers()
  batcher = ContinuousBatcher(cfg, params, num_slots=3, cache_length=CACHE_LENGTH, chunk_steps=2,
                              verify=True, draft_branches=2)
  lengths = [5, 17, 9, 24, 3]
  done = batcher.generate([Request(prompt_ids=p, max_new_tokens=n, confidence=0.001,
                                   min_token_prob=0.0) for p, n in zip(PROMPTS, lengths)])
  for c, p, n in zip(done, PROMPTS, lengths):
    assert c.tokens == base.decode([p], max_new_tokens=n).tokens[0]


@pytest.mark.slow
def test_rejected_branches_kv_entries_never_influence_later_tokens():
  """Poisons every KV slot at and after each row's next write slot after every tree step (the
  entries of rejected nodes and of the chains not taken among them): the answer is the base's."""
  base, _ = _samplers()
  sampler = _tree_sampler()
  engine = sampler.engine

  def poisoned_step(params, st):
    st = verify.verify_step(engine, params, st)
    after = jnp.arange(engine.cache_length)[None, :, None] >= st.slot[:, None, None]
    poison = lambda x: jnp.where(after, jnp.asarray(1e4, x.dtype), x)
    return st.replace(cache=jax.tree_util.tree_map(poison, st.cache))

  def run(params, st):
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done), functools.partial(poisoned_step, params),
                              st)

  state, rows = sampler.start(PROMPTS, **KNOBS)
  got = ds.DecodeResult.from_state(ds.to_host(jax.jit(run)(sampler.params, state)), rows)
  assert got.tokens == base.decode(PROMPTS, max_new_tokens=24).tokens
  assert sum(got.draft_counts[1]) > 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(draft_branches=2), "verify"), (dict(verify=True, draft_branches=0), "1..8"),
    (dict(verify=True, draft_branches=2, draft_width_rule=True), "draft_width_rule")])
def test_draft_branches_is_refused_where_it_cannot_apply(kwargs, match):
  cfg, params = drafting_model()
  with pytest.raises(DecodeInputError, match=match):
    Sampler(cfg, params, cache_length=CACHE_LENGTH, **kwargs)
