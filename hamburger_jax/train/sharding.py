"""Device mesh, logical-axis rules and NamedShardings for training (jit + Mesh, no pmap).

    mesh = make_mesh(config.mesh)                      # axes ("data", "fsdp", "tensor")
    shardings = logical_shardings(boxed_abstract, mesh, rules)
    batch_sharding(mesh)                               # rows over data x fsdp

Params carry logical axis names (`vocab`, `embed`, `mlp`, `heads`, ...); `config.logical_axis_rules`
maps them onto mesh axes. A dimension that a mesh axis does not divide is replicated instead.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
_DISTRIBUTED_ENV = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS",
                    "MEGASCALE_COORDINATOR_ADDRESS")


def maybe_initialize_distributed(mode: str = "auto") -> bool:
  """Calls `jax.distributed.initialize()` when asked or when the environment names a multi-host job.

  mode: "auto" (only if a coordinator / multi-task launcher variable is set), "always" or "never".
  Must run before anything touches the devices. Returns whether it initialised.
  """
  if mode not in ("auto", "always", "never"):
    raise ValueError(f"distributed must be 'auto', 'always' or 'never', got {mode!r}.")
  if mode == "never" or jax.distributed.is_initialized():
    return False
  env = os.environ
  multi_task = any(int(env.get(k, "1") or "1") > 1 for k in
                   ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "JAX_NUM_PROCESSES"))
  multi_tpu_host = "," in env.get("TPU_WORKER_HOSTNAMES", "")
  if mode == "always" or multi_task or multi_tpu_host or any(k in env for k in _DISTRIBUTED_ENV):
    jax.distributed.initialize()
    return True
  return False


def mesh_shape(mesh_cfg, num_devices: int) -> tuple[int, ...]:
  """Sizes of (data, fsdp, tensor) with one -1 filled from `num_devices`; ValueError if they don't fit."""
  sizes = [int(mesh_cfg[a]) for a in MESH_AXES]
  if any(s == 0 or s < -1 for s in sizes) or sizes.count(-1) > 1:
    raise ValueError(f"mesh sizes {dict(zip(MESH_AXES, sizes))} are invalid: use positive sizes "
                     "and at most one -1 (= fill with the remaining devices).")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))}: the fixed axes ({known} devices) do "
                       f"not divide the {num_devices} devices available.")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices but "
                     f"{num_devices} are available; set the sizes so that data*fsdp*tensor = "
                     f"{num_devices} (or use -1 for one axis).")
  return tuple(sizes)


def make_mesh(mesh_cfg, devices: Sequence[Any] | None = None) -> Mesh:
  """A Mesh over all devices with axes ("data", "fsdp", "tensor")."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_cfg, len(devices))
  try:
    grid = mesh_utils.create_device_mesh(shape, devices)
  except (ValueError, NotImplementedError, AssertionError):
    grid = np.asarray(devices).reshape(shape)
  return Mesh(grid, MESH_AXES)


def _fit_spec(spec: P, shape: Sequence[int], mesh: Mesh) -> P:
  """Replaces mesh axes that do not divide their dimension by None (replication)."""
  out = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    size = math.prod(mesh.shape[n] for n in names)
    if names and dim % size:
      logging.info("Replicating a dimension of size %d: mesh axes %s (%d) do not divide it.",
                   dim, names, size)
      axes = None
    out.append(axes)
  return P(*out)


def logical_shardings(boxed_abstract, mesh: Mesh, rules) -> Any:
  """Abstract tree with `LogicallyPartitioned` leaves -> tree of NamedShardings (unboxed layout)."""
  specs = nn.get_partition_spec(boxed_abstract)
  mesh_specs = nn.logical_to_mesh(specs, tuple(tuple(r) for r in rules))
  shapes = nn.meta.unbox(boxed_abstract)
  is_spec = lambda x: isinstance(x, P)
  return jax.tree.map(lambda s, a: NamedSharding(mesh, _fit_spec(s, a.shape, mesh)),
                      mesh_specs, shapes, is_leaf=is_spec)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Rows (axis 0) split over data x fsdp; other axes replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def batch_shards(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def _param_path(path) -> tuple[str, ...]:
  """The trailing run of dict keys of a key path (the param name inside an optimizer state)."""
  keys = []
  for entry in reversed(path):
    if not isinstance(entry, jax.tree_util.DictKey):
      break
    keys.append(str(entry.key))
  return tuple(reversed(keys))


def opt_state_shardings(abstract_opt_state, param_shardings, abstract_params, mesh: Mesh):
  """Shards each optimizer-state leaf like the parameter it mirrors (matched by path and shape).

  Leaves that mirror no parameter (step counts, scalars) are replicated.
  """
  by_path = {}
  for path, sh in jax.tree_util.tree_leaves_with_path(param_shardings):
    by_path[_param_path(path)] = sh
  shapes = {_param_path(p): a.shape for p, a in jax.tree_util.tree_leaves_with_path(abstract_params)}

  def pick(path, leaf):
    key = _param_path(path)
    for i in range(len(key)):           # allow the state to hold a sub-tree of the params
      if key[i:] in by_path and shapes[key[i:]] == getattr(leaf, "shape", None):
        return by_path[key[i:]]
    return replicated(mesh)
  return jax.tree_util.tree_map_with_path(pick, abstract_opt_state)


def describe(shardings) -> dict[str, str]:
  """'/'-joined param path -> PartitionSpec string (for logs and tests)."""
  return {"/".join(_param_path(p)): str(s.spec)
          for p, s in jax.tree_util.tree_leaves_with_path(shardings)}
