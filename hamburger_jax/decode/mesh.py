"""Decoding on a device mesh: one model over several chips, the same compiled loop.

    mesh = make_decode_mesh("data=2,tensor=4")          # over all devices (or `devices=`)
    sampler = Sampler(cfg, params, mesh=mesh)           # params, KV buffers and state sharded
    batcher = ContinuousBatcher(cfg, params, mesh=mesh)

Params are split by the logical axis names their Flax modules carry (`DECODE_RULES`: heads, kv
heads, MLP and vocabulary over `tensor`, the embedding width over `fsdp`); the KV buffers
[B, L, K * H] by rows over `data` x `fsdp` and by kv heads over `tensor`; every other per-row
field of the decode state by rows. Functions compiled for an engine with a mesh (`on_mesh`)
trace with the model's activation constraints on and pin a returned state to
`state_shardings`, and the loop pins its carry to them too, so the while loop keeps one layout
(no resharding between macro steps). A dimension the mesh does not divide (the rows of a small
batch bucket, a vocabulary) is replicated; heads, kv heads and the MLP width must divide.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import flax.linen as nn
import jax
from jax.sharding import Mesh, NamedSharding

from hamburger_jax.decode import state as ds
from hamburger_jax.decode.prompts import DecodeInputError
from hamburger_jax.model import int8_table, kv_cache
from hamburger_jax.model import partitioning as pt
from hamburger_jax.model.config import HamburgerConfig, LlamaConfig
from hamburger_jax.train import sharding

AXES = sharding.MESH_AXES       # ("data", "fsdp", "tensor")

# Logical axis -> mesh axes (the training rules, configs/default.py, restricted to decoding).
DECODE_RULES = (
    (pt.BATCH, ("data", "fsdp")), (pt.LENGTH, None), (pt.EMBED, None), (pt.HEADS, "tensor"),
    (pt.KV_HEADS, "tensor"), (pt.MLP, "tensor"), (pt.VOCAB, "tensor"),
    ("batch", ("data", "fsdp")), ("vocab", "tensor"), ("embed", "fsdp"), ("mlp", "tensor"),
    ("heads", "tensor"), ("kv_heads", "tensor"), ("norm", None), ("max_steps", None),
    ("stop", None),
)


def parse_mesh(spec: str) -> dict[str, int]:
  """'data=2,tensor=4' -> {"data": 2, "fsdp": 1, "tensor": 4} (axes not named are 1)."""
  sizes = dict.fromkeys(AXES, 1)
  for part in filter(None, (p.strip() for p in spec.split(","))):
    name, _, value = (s.strip() for s in part.partition("="))
    if name not in AXES:
      raise DecodeInputError(f"Unknown mesh axis {name!r} in mesh {spec!r}: use "
                             f"{', '.join(AXES)}, e.g. 'data=2,tensor=4'.")
    if not value.isdigit() or int(value) < 1:
      raise DecodeInputError(f"Mesh axis {name}={value!r}: give a positive size, e.g. "
                             f"'{name}=2'.")
    sizes[name] = int(value)
  return sizes


def make_decode_mesh(spec: str, devices: Sequence | None = None) -> Mesh:
  """A Mesh with axes ("data", "fsdp", "tensor") over `devices` (default: all of them)."""
  sizes = parse_mesh(spec)
  devices = list(jax.devices() if devices is None else devices)
  n, have = math.prod(sizes.values()), len(devices)
  if n != have:
    other = sizes["fsdp"] * sizes["tensor"]
    fix = f" (e.g. 'data={have // other},tensor={sizes['tensor']}')" if have % other == 0 else ""
    raise DecodeInputError(f"Mesh {spec!r} spans {n} devices but {have} are available: make "
                           f"data * fsdp * tensor = {have}{fix}.")
  return sharding.make_mesh(sizes, devices)


def check_model_fits(mesh: Mesh, llama: LlamaConfig) -> None:
  """DecodeInputError naming the first head / kv-head / MLP count that `tensor` does not divide."""
  t = mesh.shape["tensor"]
  dims = {"num_heads": llama.num_heads, "num_kv_heads": llama.num_kv_heads,
          "intermediate_size": llama.intermediate_size}
  fit = math.gcd(t, *dims.values())
  for name, value in dims.items():
    if value % t:
      raise DecodeInputError(f"The model's {name} = {value} is not divisible by tensor={t}: use "
                             f"tensor={fit} (it divides heads, kv heads and the MLP width) and "
                             f"put the other devices on data.")


@functools.lru_cache(maxsize=8)
def _boxed_abstract(cfg):
  """The model's abstract params with their logical axes (LogicallyPartitioned leaves)."""
  from hamburger_jax.model.hamburger import init_params
  from hamburger_jax.model.llama import init_llama_params
  init = init_params if isinstance(cfg, HamburgerConfig) else init_llama_params
  return jax.eval_shape(lambda: init(cfg, jax.random.PRNGKey(0), boxed=True))


def param_shardings(mesh: Mesh, cfg, params):
  """A tree like `params` of NamedShardings, from the logical axes of `cfg`'s Flax modules
  (cfg: HamburgerConfig or LlamaConfig, whichever params are). Leaves the modules do not declare
  with that shape (draft-vocabulary rows) are replicated; an int8 table in blocks [V/32, 32, D]
  (`int8_table`) is split as its [V, D] would be."""
  boxed = _boxed_abstract(cfg)
  declared = jax.tree_util.tree_leaves_with_path(
      sharding.logical_shardings(boxed, mesh, DECODE_RULES))
  known = {jax.tree_util.keystr(p): (s, a.shape)
           for (p, s), a in zip(declared, jax.tree.leaves(nn.meta.unbox(boxed)))}

  def pick(path, leaf):
    named, shape = known.get(jax.tree_util.keystr(path), (None, None))
    if named is not None and int8_table.is_blocked(leaf) and tuple(
        int8_table.flat(leaf).shape) == shape:
      rows, width = tuple(named.spec) + (None,) * (2 - len(named.spec))
      return NamedSharding(mesh, jax.sharding.PartitionSpec(rows, None, width))
    return named if shape == getattr(leaf, "shape", ()) else sharding.replicated(mesh)
  return jax.tree_util.tree_map_with_path(pick, params)


def place_params(mesh: Mesh | None, model, params):
  """A decode model's params on the mesh (`param_shardings`; DecodeInputError if its heads do
  not split over `tensor`), or on the default device without a mesh."""
  if mesh is None:
    return jax.device_put(params)
  check_model_fits(mesh, model.llama)
  return jax.device_put(params, param_shardings(mesh, model.cfg, params))


def place_state(mesh: Mesh | None, state: ds.DecodeState) -> ds.DecodeState:
  """A decode state on the mesh (`state_shardings`), or unchanged without a mesh."""
  return state if mesh is None else jax.device_put(state, state_shardings(mesh, state))


def state_shardings(mesh: Mesh, state: ds.DecodeState) -> ds.DecodeState:
  """NamedShardings of a decode state (arrays or abstract): KV buffers [B, L, K * H] (int8
  scales [B, K, L]) by rows and kv heads, other per-row fields [B, ..] by rows, scalars
  replicated."""
  with pt.activation_sharding(mesh, DECODE_RULES):
    named = lambda logical, x: NamedSharding(mesh, pt.mesh_axes(logical, x.shape))
    rows = lambda x: named((pt.BATCH,) + (None,) * (len(x.shape) - 1), x)
    axes = lambda name: ((pt.BATCH, pt.KV_HEADS, pt.LENGTH) if name in kv_cache.SCALES
                         else (pt.BATCH, pt.LENGTH, pt.KV_HEADS))
    cache = [{name: named(axes(name), x) for name, x in layer.items()} for layer in state.cache]
    return jax.tree.map(rows, state.replace(cache=None)).replace(cache=cache)


def constrain_state(mesh: Mesh | None, state: ds.DecodeState) -> ds.DecodeState:
  """Inside jit: `state` pinned to `state_shardings` (unchanged without a mesh)."""
  if mesh is None:
    return state
  return jax.lax.with_sharding_constraint(state, state_shardings(mesh, state))


def on_mesh(fn):
  """fn(engine, *args) traced on `engine.mesh` (if any): the model's activation constraints
  see the mesh, and a returned DecodeState is pinned to `state_shardings`."""
  @functools.wraps(fn)
  def run(engine, *args):
    mesh = getattr(engine, "mesh", None)
    if mesh is None:
      return fn(engine, *args)
    with pt.activation_sharding(mesh, DECODE_RULES):
      out = fn(engine, *args)
    return constrain_state(mesh, out) if isinstance(out, ds.DecodeState) else out
  return run
