"""`stored_param`: an apply reads given parameters without tracing their initializers, computes
what Flax's own lookup computes, and refuses a parameter of the wrong shape."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import errors

from hamburger_jax.model.layers import RMSNorm
from hamburger_jax.model.quantize import Dense


def _counting_init(calls):
  def init(key, shape, dtype=jnp.float32):
    calls.append(shape)
    return jax.random.normal(key, shape, dtype)
  return init


def test_an_apply_traces_no_initializer_and_matches_flax_dense():
  calls = []
  ours = Dense(5, use_bias=True, kernel_init=_counting_init(calls))
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 4))
  params = ours.init(jax.random.PRNGKey(0), x)["params"]
  assert calls == [(4, 5)]                                  # init: the initializer runs once
  params = {"kernel": params["kernel"], "bias": jnp.arange(5.0)}
  y = jax.jit(ours.apply)({"params": params}, x)
  assert calls == [(4, 5)]                                  # apply: no initializer traced
  flax_y = nn.Dense(5, use_bias=True).apply({"params": params}, x)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(flax_y))


def test_a_parameter_of_the_wrong_shape_is_refused_by_name():
  x = jnp.ones((2, 4))
  with pytest.raises(errors.ScopeParamShapeError, match="kernel"):
    Dense(5).apply({"params": {"kernel": jnp.ones((4, 6))}}, x)
  with pytest.raises(errors.ScopeParamShapeError, match="scale"):
    RMSNorm(1e-6).apply({"params": {"scale": jnp.ones((3,))}}, x)


def test_a_missing_parameter_is_flaxs_error():
  with pytest.raises(errors.ScopeParamNotFoundError, match="kernel"):
    Dense(5).apply({"params": {"other": jnp.ones((4, 5))}}, jnp.ones((2, 4)))
