"""Unit tests of the decode state's pure pieces (masked writes, stop probability, results)."""

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.decode import state as ds
from hamburger_jax.decode.sampler import continue_probability
def test_masked_set_writes_variable_lengths_and_drops_overflow():
  buf = jnp.zeros((3, 5), jnp.int32)
  values = jnp.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
  out = ds.masked_set(buf, jnp.array([0, 3, 4]), values, jnp.array([2, 3, 0]))
  np.testing.assert_array_equal(out, [[1, 2, 0, 0, 0], [0, 0, 0, 4, 5], [0, 0, 0, 0, 0]])


def test_continue_probability_is_one_minus_sigmoid():
  x = jnp.array([-3.0, 0.0, 2.5])
  np.testing.assert_allclose(continue_probability(x), 1 - jax.nn.sigmoid(x), atol=1e-7)


def test_result_groups_cut_tokens_by_group_ids():
  st = ds.DecodeState(
      cache=None, slot=np.array([7]), position=np.array([9]), group_tokens=None, group_len=None,
      out_tokens=np.array([[5, 6, 7, 8, 0]]), out_group=np.array([[0, 0, 1, 2, 0]]),
      out_logprob=np.zeros((1, 5)), out_logit=np.zeros((1, 5)), out_stop=np.zeros((1, 5)),
      num_out=np.array([4]), macro_steps=np.array([3]), done=np.array([True]),
      finish=np.array([ds.LENGTH]), rng=None, iteration=np.array(3), out_start=np.array([0]),
      in_fence=np.array([False]),
      knobs=None, micro_policy=None)
  r = ds.DecodeResult.from_state(st, 1)
  assert r.groups(0) == [[5, 6], [7], [8]]
  assert r.prompt_lengths == [5] and r.finish_reasons == ["length"]
  stats = r.stats()
  assert stats["kv_slots_used"] == 5 + 3 - 1 and stats["kv_slots_base"] == 5 + 4 - 1
  assert stats["tokens_per_macro_step"] == 4 / 3
