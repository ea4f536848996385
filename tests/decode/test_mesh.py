"""Decoding on a device mesh (`decode/mesh.py`): mesh parsing and its errors here; the same
tokens as one device on 8 fake CPU devices in one subprocess (`mesh_cases.py`)."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh

from hamburger_jax.decode.mesh import (check_model_fits, make_decode_mesh, param_shardings,
                                       parse_mesh)
from hamburger_jax.decode.sampler import DecodeInputError
from hamburger_jax.model.hamburger import init_params
from hamburger_jax.testing.fixtures import tiny_config
from hamburger_jax.train import aot

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_parse_mesh_fills_unnamed_axes_with_one():
  assert parse_mesh("tensor=4") == {"data": 1, "fsdp": 1, "tensor": 4}
  assert parse_mesh(" data=2 , tensor=4 ") == {"data": 2, "fsdp": 1, "tensor": 4}
  assert parse_mesh("") == {"data": 1, "fsdp": 1, "tensor": 1}


@pytest.mark.parametrize("spec, message", [
    ("model=2", "Unknown mesh axis 'model'"), ("tensor=0", "give a positive size"),
    ("tensor", "give a positive size"), ("data=x", "give a positive size")])
def test_bad_mesh_specs_name_the_problem(spec, message):
  with pytest.raises(DecodeInputError, match=message):
    parse_mesh(spec)


def test_a_mesh_must_span_the_devices():
  n = jax.device_count()
  with pytest.raises(DecodeInputError, match=f"spans {4 * n} devices but {n} are available"):
    make_decode_mesh(f"data={n},tensor=4")
  assert dict(make_decode_mesh(f"data={n}").shape) == {"data": n, "fsdp": 1, "tensor": 1}


def test_tensor_must_divide_the_kv_heads():
  cfg = tiny_config(4)                      # 4 heads, 2 kv heads
  mesh = lambda t: AbstractMesh((1, 1, t), ("data", "fsdp", "tensor"))
  check_model_fits(mesh(2), cfg.base)
  with pytest.raises(DecodeInputError, match=r"num_kv_heads = 2 is not divisible by tensor=4: "
                                             r"use tensor=2"):
    check_model_fits(mesh(4), cfg.base)


def test_param_shardings_follow_the_modules_logical_axes():
  cfg = tiny_config(2)
  mesh = make_decode_mesh("tensor=1")
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
  full = param_shardings(mesh, cfg, {**params, "draft": {"table": jnp.zeros((3, 64))}})
  base = param_shardings(mesh, cfg.base, params["base"])     # the base decoding alone
  q = ("layers_0", "self_attn", "q_proj", "kernel")
  assert str(_at(full, ("base",) + q).spec) == str(_at(base, q).spec) == "P('fsdp', 'tensor')"
  assert str(_at(full, ("micro_decoder", "layers_0", "mlp", "down_proj", "kernel")).spec) == (
      "P('tensor', 'fsdp')")
  assert str(_at(full, ("draft", "table")).spec) == "P()"     # not a module's param: replicated


def _at(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def test_serve_flag_parses_and_bad_meshes_are_refused_before_loading():
  from hamburger_jax.serve.cli import check_args, parse_args  # pylint: disable=g-import-not-at-top
  assert parse_args(["--ckpt", "x"]).mesh == ""
  assert parse_args(["--ckpt", "x", "--mesh", "data=2,tensor=4"]).mesh == "data=2,tensor=4"
  with pytest.raises(DecodeInputError, match="Unknown mesh axis 'model'"):
    check_args(parse_args(["--ckpt", "x", "--mesh", "model=2"]))


@pytest.fixture(scope="module")
def eight_devices():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO,
             XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
             + " --xla_force_host_platform_device_count=8")
  out = subprocess.run([sys.executable, "-m", "tests.decode.mesh_cases"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=1200)
  assert out.returncode == 0, out.stderr[-3000:]
  print(out.stderr)
  (line,) = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
  return json.loads(line[len("RESULT "):])


def _same_as_one_device(runs):
  one = runs.pop("one")
  assert runs and all(len(row) > 1 for row in one["tokens"])
  for spec, got in runs.items():
    assert got == one, spec


@pytest.mark.slow
def test_merged_greedy_decoding_on_meshes_equals_one_device(eight_devices):
  assert eight_devices["devices"] == 8
  merged = eight_devices["merged"]
  assert set(merged) == {"one", "tensor=2", "data=2,tensor=2"}
  assert any(size > 1 for row in merged["one"]["groups"] for size in row)   # merged groups
  _same_as_one_device(merged)


@pytest.mark.slow
def test_verified_decoding_on_a_mesh_equals_one_device(eight_devices):
  _same_as_one_device(eight_devices["verified"])


@pytest.mark.slow
def test_int8_kv_buffers_verified_is_the_int8_base_on_a_mesh_and_one_device(eight_devices):
  assert eight_devices["int8_kv_dtypes"] == ["float32", "int32"]     # packed values, scales
  assert eight_devices["int8_kv_scale_spec"] == "P('data', 'tensor')"   # [B, K, L]: rows, heads
  runs = eight_devices["int8_kv"]
  assert runs["one"]["tokens"] == eight_devices["int8_kv_base"]["tokens"]   # the base's answer
  assert any(size > 1 for row in runs["one"]["groups"] for size in row)     # drafts accepted
  _same_as_one_device(runs)


@pytest.mark.slow
def test_continuous_batching_on_a_mesh_equals_one_device(eight_devices):
  got = eight_devices["batching"]
  assert got["data=2,tensor=2"] == got["one"] and all(got["one"])


@pytest.mark.slow
def test_params_and_kv_buffers_are_sharded_and_knobs_never_retrace(eight_devices):
  specs = eight_devices["specs"]
  assert specs["q_proj"] == "P('fsdp', 'tensor')"            # [D, heads] split over tensor
  assert specs["down_proj"] == "P('tensor', 'fsdp')"
  assert specs["embedding"] == "P('tensor', 'fsdp')"         # vocabulary rows over tensor
  assert specs["q_proj_shard"] == [64, 32]                   # [64, 4 x 16] over tensor=2
  assert specs["kv_cache"] == "P('data', None, 'tensor')"    # rows x kv heads
  assert specs["kv_cache_shard"] == [2, 32, 16]              # [4, 32, 2 x 16] over 2 x 2
  assert specs["out_tokens"] == "P('data',)"
  assert eight_devices["retraces"] == {"prefill": 0, "loop": 0}
  assert eight_devices["kv_collectives"] == []               # no resharding between steps
  assert "num_kv_heads = 2 is not divisible by tensor=4" in eight_devices["tensor4_error"]


@pytest.mark.slow
@pytest.mark.skipif(not aot.libtpu_available(), reason="libtpu is not installed")
def test_decode_loop_compiles_on_a_v5e_mesh():
  cfg = tiny_config(4)
  cfg = cfg.replace(base=dataclasses.replace(cfg.base, dtype="bfloat16", param_dtype="bfloat16"))
  report = aot.compile_decode_loop(cfg, aot.topology_devices("v5e:2x2"), batch=8,
                                   cache_length=256, mesh="data=2,tensor=2")
  assert report["fits"] and report["chips"] == 4, report
  assert report["kv_cache_gib_per_chip"] == report["kv_cache_gib"] / 4     # rows x kv heads
  assert report["param_gib"] / 2 <= report["param_gib_per_chip"] < report["param_gib"]
  assert report["argument_gib"] < report["kv_cache_gib"] + report["param_gib"]   # per chip
