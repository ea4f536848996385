"""The optimizer: two learning rates, warmup + cosine floor, decay mask, frozen split, clipping."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import default
from hamburger_jax.train import optim


def _params():
  return {"base": {"embed_tokens": {"embedding": jnp.ones((8, 4))},
                   "layers_0": {"mlp": {"up_proj": {"kernel": jnp.ones((4, 6))}},
                                "input_layernorm": {"scale": jnp.ones(4)}}},
          "embedder": {"pos": jnp.ones((4, 2)), "q_proj": {"kernel": jnp.ones((4, 4)),
                                                           "bias": jnp.ones(4)}},
          "micro_decoder": {"stop_head": {"dense_0": {"kernel": jnp.ones((4, 4))}}}}


def _optim_cfg(**overrides):
  c = default.get_config().optim
  c.update(overrides)
  return c


def test_defaults_follow_the_paper():
  c = default.get_config().optim
  assert (c.base_lr, c.grafted_lr, c.end_lr, c.grad_clip_norm, c.grad_accum_steps) == (
      5e-5, 1e-4, 1e-5, 1.0, 2)


def test_schedule_warmup_peak_and_floor():
  sched = optim.schedules(_optim_cfg(warmup_steps=10), total_steps=100)
  assert float(sched["base"](0)) == 0.0
  assert np.isclose(float(sched["base"](10)), 5e-5)
  assert np.isclose(float(sched["grafted"](10)), 1e-4)
  assert np.isclose(float(sched["base"](100)), 1e-5)
  assert np.isclose(float(sched["grafted"](100)), 1e-5)
  mid = float(sched["grafted"](55))
  assert 1e-5 < mid < 1e-4


def test_labels_and_decay_mask():
  labels = optim.param_labels(_params())
  assert labels["base"]["layers_0"]["mlp"]["up_proj"]["kernel"] == "base"
  assert labels["embedder"]["q_proj"]["kernel"] == "grafted"
  assert labels["micro_decoder"]["stop_head"]["dense_0"]["kernel"] == "grafted"
  mask = optim.decay_mask(_params())
  assert mask["base"]["layers_0"]["mlp"]["up_proj"]["kernel"]
  assert mask["micro_decoder"]["stop_head"]["dense_0"]["kernel"]
  assert not mask["base"]["embed_tokens"]["embedding"]
  assert not mask["base"]["layers_0"]["input_layernorm"]["scale"]
  assert not mask["embedder"]["q_proj"]["bias"]
  assert not mask["embedder"]["pos"]


def test_trainable_keys_and_split():
  assert optim.trainable_keys("hamburger", False) == ("base", "embedder", "micro_decoder",
                                                       "merge_adapter")
  assert optim.trainable_keys("hamburger", True) == ("embedder", "micro_decoder", "merge_adapter")
  assert optim.trainable_keys("base_lm", False) == ("base",)
  with pytest.raises(ValueError, match="train nothing"):
    optim.trainable_keys("base_lm", True)
  train, frozen = optim.split_params(_params(), ("embedder", "micro_decoder"))
  assert set(train) == {"embedder", "micro_decoder"} and set(frozen) == {"base"}


def test_two_learning_rates_and_no_decay_where_masked():
  """With zero gradients only weight decay moves params: lr x wd on decayed leaves, 0 elsewhere."""
  cfg = _optim_cfg(warmup_steps=0, weight_decay=0.1, base_lr=1e-2, grafted_lr=2e-2, end_lr=1e-2)
  tx = optim.make_optimizer(cfg, total_steps=10)
  params = _params()
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  np.testing.assert_allclose(updates["base"]["layers_0"]["mlp"]["up_proj"]["kernel"], -1e-3)
  np.testing.assert_allclose(updates["micro_decoder"]["stop_head"]["dense_0"]["kernel"], -2e-3)
  np.testing.assert_allclose(updates["base"]["embed_tokens"]["embedding"], 0.0)
  np.testing.assert_allclose(updates["embedder"]["q_proj"]["bias"], 0.0)


def test_adam_step_sizes_and_clipping():
  cfg = _optim_cfg(warmup_steps=0, weight_decay=0.0, base_lr=1e-2, grafted_lr=2e-2, end_lr=1e-2,
                   grad_clip_norm=1.0)
  tx = optim.make_optimizer(cfg, total_steps=10)
  params = _params()
  grads = jax.tree.map(lambda p: 100.0 * jnp.ones_like(p), params)
  updates, _ = tx.update(grads, tx.init(params), params)
  # Adam's first step is lr * sign(g) whatever the scale: each label gets its own lr.
  np.testing.assert_allclose(updates["base"]["layers_0"]["mlp"]["up_proj"]["kernel"], -1e-2,
                             rtol=1e-4)
  np.testing.assert_allclose(updates["embedder"]["pos"], -2e-2, rtol=1e-4)
  clip = optax.clip_by_global_norm(1.0)
  clipped, _ = clip.update(grads, clip.init(params))
  assert np.isclose(float(optax.global_norm(clipped)), 1.0, rtol=1e-5)
