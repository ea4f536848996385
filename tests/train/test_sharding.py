"""Mesh construction, logical-axis shardings, and 8 fake CPU devices matching one device."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from configs import tiny
from hamburger_jax.train import sharding
from hamburger_jax.train.loop import train_and_evaluate
from hamburger_jax.train.run_config import model_config
from hamburger_jax.train.setup import Setup

from tests.fixture_paths import REPO


def test_mesh_shape_fills_and_rejects():
  assert sharding.mesh_shape({"data": -1, "fsdp": 2, "tensor": 2}, 8) == (2, 2, 2)
  assert sharding.mesh_shape({"data": 1, "fsdp": -1, "tensor": 1}, 4) == (1, 4, 1)
  with pytest.raises(ValueError, match="needs 6 devices but 8 are available"):
    sharding.mesh_shape({"data": 3, "fsdp": 2, "tensor": 1}, 8)
  with pytest.raises(ValueError, match="do not divide the 8 devices"):
    sharding.mesh_shape({"data": -1, "fsdp": 3, "tensor": 1}, 8)
  with pytest.raises(ValueError, match="at most one -1"):
    sharding.mesh_shape({"data": -1, "fsdp": -1, "tensor": 1}, 8)


def test_logical_shardings_and_opt_state():
  c = tiny.get_config()
  mesh = sharding.make_mesh(c.mesh)
  setup = Setup(c, model_config(c), mesh)
  specs = sharding.describe(setup.shardings.params)
  assert specs["base/embed_tokens/embedding"] == str(P("tensor", "fsdp"))
  assert specs["base/layers_0/mlp/down_proj/kernel"] == str(P("tensor", "fsdp"))
  assert specs["base/norm/scale"] == str(P(None))
  # The optimizer moments are sharded like their parameters; counts are replicated.
  opt = jax.tree_util.tree_leaves_with_path(setup.shardings.opt_state)
  mu = [s for p, s in opt if "mu" in jax.tree_util.keystr(p)
        and jax.tree_util.keystr(p).endswith("['embed_tokens']['embedding']")]
  assert mu and all(s.spec == P("tensor", "fsdp") for s in mu)


def test_indivisible_dimension_is_replicated():
  class FakeMesh:          # _fit_spec reads only .shape
    shape = {"data": 1, "fsdp": 4, "tensor": 2}
  assert sharding._fit_spec(P("tensor", "fsdp"), (6, 8), FakeMesh) == P("tensor", "fsdp")
  assert sharding._fit_spec(P("tensor", "fsdp"), (6, 6), FakeMesh) == P("tensor", None)
  assert sharding._fit_spec(P(("data", "fsdp")), (8, 3), FakeMesh) == P(("data", "fsdp"), None)
  assert sharding._fit_spec(P(("data", "fsdp")), (2,), FakeMesh) == P(None)


_SCRIPT = r"""
import json, sys
import jax
from configs import tiny
from hamburger_jax.train import sharding
from hamburger_jax.train.loop import train_and_evaluate
from hamburger_jax.train.run_config import model_config
from hamburger_jax.train.setup import Setup
c = tiny.get_config()
c.update_from_flattened_dict(json.loads(sys.argv[2]))
state = train_and_evaluate(c, sys.argv[1])
params = jax.tree.map(lambda x: x.sharding, state.params)
emb = state.params["base"]["embed_tokens"]["embedding"]
print("RESULT " + json.dumps({
    "devices": jax.device_count(),
    "specs": sharding.describe(params),
    "embedding_shard_shape": list(emb.addressable_shards[0].data.shape),
    "embedding_devices": len({s.device for s in emb.addressable_shards}),
}))
"""

_OVERRIDES = {"num_train_steps": 6, "logging.every_steps": 1, "eval.every_steps": 6,
              "checkpoint.every_steps": 6, "checkpoint.export": False,
              "logging.progress_bar": False, "logging.tensorboard": False,
              "optim.grad_accum_steps": 2}


def _run(workdir, devices: int, mesh, cache_dir):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO,
             XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
             + f" --xla_force_host_platform_device_count={devices}",
             JAX_COMPILATION_CACHE_DIR=str(cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  overrides = dict(_OVERRIDES, **{f"mesh.{k}": v for k, v in mesh.items()})
  out = subprocess.run([sys.executable, "-c", _SCRIPT, str(workdir), json.dumps(overrides)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  (line,) = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
  rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  losses = [r["train/loss"] for r in rows if "train/loss" in r]
  evals = [r["eval/loss"] for r in rows if "eval/loss" in r]
  return json.loads(line[len("RESULT "):]), losses, evals


@pytest.mark.slow
def test_eight_devices_match_one(tmp_path, tmp_path_factory):
  cache = tmp_path_factory.getbasetemp() / "jax_cache"
  one, losses_1, eval_1 = _run(tmp_path / "one", 1, {"data": 1, "fsdp": 1, "tensor": 1}, cache)
  eight, losses_8, eval_8 = _run(tmp_path / "eight", 8, {"data": 2, "fsdp": 2, "tensor": 2}, cache)
  assert one["devices"] == 1 and eight["devices"] == 8
  assert len(losses_8) == len(losses_1) == 6
  print("max relative loss difference", np.max(np.abs(np.array(losses_8) / losses_1 - 1)))
  np.testing.assert_allclose(losses_8, losses_1, rtol=2e-5)
  np.testing.assert_allclose(eval_8, eval_1, rtol=2e-5)
  assert losses_1[-1] < losses_1[0]
  # Parameters really are split over the mesh.
  specs = eight["specs"]
  assert specs["base/embed_tokens/embedding"] == str(P("tensor", "fsdp"))
  assert specs["base/layers_0/self_attn/q_proj/kernel"] == str(P("fsdp", "tensor"))
  assert specs["micro_decoder/layers_0/mlp/up_proj/kernel"] == str(P("fsdp", "tensor"))
  assert eight["embedding_shard_shape"] == [128, 32]        # [256, 64] over tensor=2 x fsdp=2
  assert eight["embedding_devices"] == 8
  assert one["embedding_shard_shape"] == [256, 64]
