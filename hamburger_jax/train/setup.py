"""Everything a run builds once: abstract state, NamedShardings from logical axis rules, and the
jitted init / train / eval steps (`Setup`), plus placing pretrained host arrays on the mesh.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.model import partitioning
from hamburger_jax.model.config import HamburgerConfig
from hamburger_jax.model.hamburger import init_params
from hamburger_jax.model.llama import init_llama_params
from hamburger_jax.train import checkpoints, optim, sharding
from hamburger_jax.train.losses import make_loss_fn
from hamburger_jax.train.run_config import execution_config
from hamburger_jax.train.step import TrainState, eval_step, train_step

def init_model_params(config, cfg: HamburgerConfig, rng, boxed: bool = False):
  """Random params of `config.mode`: the full HAMburger tree or {"base": ...}."""
  if config.mode == "base_lm":
    return {"base": init_llama_params(cfg.base, rng, boxed=boxed)}
  return init_params(cfg, rng, boxed=boxed)


class Setup:
  """What the loop needs, built once: shardings, abstract state, jitted init/train/eval steps."""

  def __init__(self, config, cfg: HamburgerConfig, mesh):
    self.config, self.cfg, self.mesh = config, cfg, mesh
    self.trainable = optim.trainable_keys(config.mode, config.freeze_base)
    self.tx = optim.make_optimizer(config.optim, config.num_train_steps)
    self.use_teacher = (config.mode == "hamburger" and bool(config.loss.kl_weight)
                        and "base" in self.trainable)
    rng = jax.random.PRNGKey(config.seed)
    boxed = jax.eval_shape(lambda: init_model_params(config, cfg, rng, boxed=True))
    p_shard = sharding.logical_shardings(boxed, mesh, config.logical_axis_rules)
    self.abstract = jax.eval_shape(self._init_state, rng)
    o_shard = sharding.opt_state_shardings(self.abstract.opt_state, p_shard,
                                           self.abstract.params, mesh)
    self.shardings = TrainState(step=sharding.replicated(mesh), params=p_shard, opt_state=o_shard,
                                teacher=p_shard["base"] if self.use_teacher else None)
    self.data_sharding = sharding.batch_sharding(mesh)
    loss_fn = sharded_loss(make_loss_fn(config, cfg, execution_config(config)), mesh,
                           config.logical_axis_rules)
    step_fn = functools.partial(
        train_step, loss_fn=loss_fn, tx=self.tx, trainable=self.trainable,
        accum_steps=config.optim.grad_accum_steps,
        micro_sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
            sharding.BATCH_AXES)), lr_fns=optim.schedules(config.optim, config.num_train_steps))
    self.train_step = jax.jit(step_fn, in_shardings=(self.shardings, self.data_sharding),
                              out_shardings=(self.shardings, sharding.replicated(mesh)),
                              donate_argnums=0)
    self.eval_step = jax.jit(functools.partial(eval_step, loss_fn=loss_fn),
                             in_shardings=(p_shard, self.data_sharding, self.shardings.teacher),
                             out_shardings=sharding.replicated(mesh))

  def _init_state(self, rng) -> TrainState:
    params = init_model_params(self.config, self.cfg, rng)
    train_p, _ = optim.split_params(params, self.trainable)
    teacher = jax.tree.map(jnp.copy, params["base"]) if self.use_teacher else None
    return TrainState(jnp.zeros((), jnp.int32), params, self.tx.init(train_p), teacher)

  def init_state(self, pretrained: dict | None = None) -> TrainState:
    """A fresh state created already sharded; `pretrained` sub-trees replace the random init."""
    state = jax.jit(self._init_state, out_shardings=self.shardings)(
        jax.random.PRNGKey(self.config.seed))
    if not pretrained:
      return state
    params = dict(state.params)
    for key, tree in pretrained.items():
      params[key] = place(tree, self.abstract.params[key], self.shardings.params[key], key)
    teacher = (place(pretrained["base"], self.abstract.params["base"],
                     self.shardings.params["base"], "base")
               if self.use_teacher and "base" in pretrained else state.teacher)
    return state.replace(params=params, teacher=teacher)

  def abstract_state(self):
    return checkpoints.abstract_with_shardings(self.abstract, self.shardings)


def sharded_loss(loss_fn, mesh, rules):
  """loss_fn traced with activation sharding constraints (and kernels shard_mapped) on `mesh`."""
  def wrapped(*args, **kwargs):
    with partitioning.activation_sharding(mesh, rules):
      return loss_fn(*args, **kwargs)
  return wrapped


def place(tree, abstract, shardings, name: str):
  """Host arrays -> device arrays of the abstract dtypes/shardings; ValueError on a shape mismatch."""
  def put(path, x, a, s):
    if tuple(np.shape(x)) != tuple(a.shape):
      raise ValueError(f"Checkpoint param {name}{jax.tree_util.keystr(path)} has shape "
                       f"{np.shape(x)}, the model expects {a.shape}.")
    return jax.make_array_from_callback(a.shape, s, lambda idx: np.asarray(x, a.dtype)[idx])
  return jax.tree_util.tree_map_with_path(put, tree, abstract, shardings)
