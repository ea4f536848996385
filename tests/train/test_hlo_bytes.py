"""Byte attribution of optimized XLA programs (`hamburger_jax.train.hlo_bytes`)."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from hamburger_jax.train import aot, hlo_bytes


def test_array_bytes_pad_to_the_first_tile_and_memory_space_is_read():
  # [8, 256, 32] bf16 with the minor dim 32 padded to 128 lanes.
  assert hlo_bytes.shape_bytes("bf16[8,256,32]{2,1,0:T(8,128)(2,1)}") == 8 * 256 * 128 * 2
  # Dims 2 and 1 swapped in memory: [8, 32, 256], no padding.
  assert hlo_bytes.shape_bytes("bf16[8,256,32]{1,2,0:T(8,128)(2,1)}") == 8 * 256 * 32 * 2
  assert hlo_bytes.shape_bytes("f32[3,5]{1,0}") == 60
  both = "(f32[4]{0:T(128)}, bf16[8,128]{1,0:T(8,128)(2,1)S(1)})"
  assert hlo_bytes.arrays(both) == [(512, True), (2048, False)]
  assert hlo_bytes.shape_bytes(both, hbm=True) == 512


def _program(params, cache, x, n):
  """6 counted matmuls with a weight, n passes over a KV-like buffer, one in-place row write."""
  with jax.named_scope("first"):
    h = jax.lax.fori_loop(0, 6, lambda i, h: jnp.tanh(h @ params["w"]), x)
  with jax.named_scope("second"):
    h = jax.lax.fori_loop(0, n, lambda i, h: h + cache[i % 4].sum(0), h)
  cache = jax.lax.dynamic_update_slice(cache, h[None, :1].astype(cache.dtype), (0, 0, 0))
  return h, cache


def test_cpu_program_sums_to_xla_and_loops_are_weighted():
  args = ({"w": jnp.zeros((256, 256), jnp.float32)}, jnp.zeros((4, 64, 256), jnp.float32),
          jnp.zeros((8, 256), jnp.float32), jnp.int32(3))
  compiled = jax.jit(_program, donate_argnums=1, backend="cpu").lower(*args).compile()
  xla = compiled.cost_analysis()
  xla = (xla[0] if isinstance(xla, (list, tuple)) else xla)["bytes accessed"]
  report = hlo_bytes.attribute(compiled.as_text(),
                               trips={"first/while": 6, "second/while": 3})
  assert report["xla_once"] == pytest.approx(xla, rel=0.01)
  assert sorted(loop["trips"] for loop in report["loops"]) == [3, 6]
  groups = report["groups"]["xla"]
  weight = 256 * 256 * 4
  assert groups["weights"] == 6 * weight                   # the weight once per trip
  assert 3 * 64 * 256 * 4 <= groups["kv_cache"] < 4 * 64 * 256 * 4   # 3 slices + one row
  assert groups["activations"] > 0
  assert report["xla"] == pytest.approx(sum(groups.values()))
  assert report["xla"] == pytest.approx(sum(r["xla"] * r["count"] for r in report["ops"]))


needs_libtpu = pytest.mark.skipif(not aot.libtpu_available(),
                                  reason="libtpu is not installed: pip install 'libtpu==0.0.42.*'")


@needs_libtpu
@pytest.mark.slow     # one TPU compile of a 2-layer decode loop (~30 s)
def test_tpu_decode_step_attribution_sums_to_xla_and_fills_the_groups():
  from benchmarks.tpu import step_bytes
  from hamburger_jax.model.config import get_preset
  cfg = get_preset("tiny")
  # 1B-wide layers (MB-sized ops: XLA's per-op count is reproduced within 1% on the 1B loops;
  # programs of KB-sized ops deviate more), 2 of them, a 32k vocabulary.
  base = dataclasses.replace(cfg.base, num_layers=2, hidden_size=2048, intermediate_size=8192,
                             num_heads=32, num_kv_heads=8, head_dim=64, vocab_size=32000,
                             dtype="bfloat16", param_dtype="bfloat16")
  cfg = cfg.replace(base=base, feature_layers=(0, 0, 1), num_micro_layers=1, merger_heads=4)
  device = aot.topology_devices("v5e:2x2", 1)[0]
  report = aot.compile_decode_loop(cfg, device, batch=8, cache_length=512, base=True,
                                   inspect=step_bytes.inspector(cfg, "base", 8, 512))
  b = report["bytes"]
  assert b["xla_once"] == pytest.approx(report["bytes_accessed"], rel=0.02), b["xla_once"]
  hbm, xla = b["groups"]["hbm"], b["groups"]["xla"]
  assert xla["weights"] > 0 and xla["kv_cache"] > 0 and xla["activations"] > 0
  assert b["hbm_step"] <= b["xla_step"]
  assert sum(x for x, _ in b["by_opcode"].values()) == pytest.approx(b["xla_step"])
  # The attention loop runs over all 8 KV blocks: the cache is read once per step.
  assert 0.9 * b["floor"]["kv_cache"] <= xla["kv_cache"] <= 1.5 * b["floor"]["kv_cache"]
  assert b["floor"]["total"] == pytest.approx(b["floor"]["weights"] + b["floor"]["kv_cache"])


@needs_libtpu
def test_a_relayout_fused_into_a_slice_reads_only_the_slice():
  """One row of an int8 table in blocks [V/32, 32, D] on a v5e chip: XLA fuses a re-tiling of the
  whole table into the slice's fusion and counts (moves) only the slice; so does hbm."""
  from hamburger_jax.model import int8_table
  device = aot.topology_devices("v5e:2x2", 1)[0]
  on_chip = lambda shape, dtype: jax.ShapeDtypeStruct(
      shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device))
  compiled = jax.jit(lambda t, i: int8_table.take(t, i).astype(jnp.bfloat16)).lower(
      on_chip((1024, 32, 2048), jnp.int8), on_chip((1,), jnp.int32)).compile()
  text = compiled.as_text()
  assert "copy_fusion" in text                           # the fused re-tiling is there
  xla = compiled.cost_analysis()
  xla = (xla[0] if isinstance(xla, (list, tuple)) else xla)["bytes accessed"]
  report = hlo_bytes.attribute(text)
  table = 1024 * 32 * 2048
  assert report["hbm"] < 0.01 * table and xla < 0.01 * table, (report["hbm"], xla)


def test_an_update_in_place_nested_in_a_fusion_writes_only_the_update():
  """KV entries written at per-row slots, converted on the way: XLA TPU nests the scatter's
  fusion inside the convert's, the output aliasing the buffer; like a top-level in-place update,
  only the update is read and written, not the 4 MB buffer."""
  device = aot.topology_devices("v5e:2x2", 1)[0]
  on_chip = lambda shape, dtype: jax.ShapeDtypeStruct(
      shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device))
  write = lambda buf, slot, new: buf.at[slot[0] + jnp.arange(4)].set(
      new[0].astype(buf.dtype), mode="drop")
  compiled = jax.jit(write, donate_argnums=0).lower(
      on_chip((4096, 512), jnp.bfloat16), on_chip((1,), jnp.int32),
      on_chip((1, 4, 512), jnp.float32)).compile()
  text = compiled.as_text()
  root = next(line for line in text.splitlines() if line.strip().startswith("ROOT %scatter_"))
  assert "fusion(" in root                               # the scatter is a nested fusion's root
  report = hlo_bytes.attribute(text)
  assert report["hbm"] < 0.01 * 4096 * 512 * 2, report["hbm"]
