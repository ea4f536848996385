"""The real XLA TPU compiler (libtpu, no TPU needed) plans the paper's recipe and the decode loop.

Skipped when libtpu is not importable (pip install -r requirements-test.txt installs it).
"""

import dataclasses

import pytest

from hamburger_jax.train import aot

pytestmark = pytest.mark.skipif(not aot.libtpu_available(),
                                reason="libtpu is not installed: pip install 'libtpu==0.0.42.*'")


@pytest.mark.heavy       # ~370 CPU-s of compiling (3.6 min on 2 cores, 4.7 GB resident)
@pytest.mark.run_first
@pytest.mark.slow
def test_llama3_1b_recipe_train_step_fits_v5e_2x4():
  from configs import llama3_1b
  config = llama3_1b.get_config()
  report = aot.compile_train_step(config, aot.topology_devices("v5e:2x4"))
  assert report["fits"], report
  assert report["total_gib"] <= 14.0, report
  # Params, Adam moments and nothing else big are arguments: ~1.5B x 12 bytes / 8 chips.
  assert 1.5 < report["argument_gib"] < 3.0, report
  # Matmul FLOPs of one step (loops weighted by trips) within 1.4x the model FLOPs.
  from benchmarks.tpu_plan import model_flops
  assert 1.0 < report["matmul_flops"] * 8 / model_flops(config) <= 1.4, report


def _draft_vocab_config():
  """2 layers of the tiny preset with an 8,192-token vocabulary, bf16."""
  from hamburger_jax.model.config import get_preset
  cfg = get_preset("tiny")
  base = dataclasses.replace(cfg.base, num_layers=2, vocab_size=8192, dtype="bfloat16",
                             param_dtype="bfloat16")
  return cfg.replace(base=base, feature_layers=(0, 1), num_micro_layers=1, merger_heads=4)


@pytest.fixture(scope="module")
def verified_loops():
  """{K: the verified decode loop's report on one v5e chip, drafts from K ids (0: all)}, batch 1,
  256 slots, with the step's byte attribution (compiled once for the tests of this file)."""
  from benchmarks.tpu import step_bytes
  cfg = _draft_vocab_config()
  device = aot.topology_devices("v5e:2x2", 1)[0]
  return {k: aot.compile_decode_loop(cfg, device, batch=1, cache_length=256, verify=True,
                                     draft_vocab=k,
                                     inspect=step_bytes.inspector(cfg, "verify", 1, 256,
                                                                  draft_vocab=k))
          for k in (0, 256)}


def _check_loop_report(report):
  assert report["fits"], report
  # The KV cache and the params are the loop's arguments (donated: aliased to its outputs).
  assert report["argument_gib"] >= report["kv_cache_gib"] + report["param_gib"], report
  assert report["alias_gib"] >= report["kv_cache_gib"], report
  assert report["bytes_accessed"] > 0


@pytest.mark.slow
def test_merged_decode_loop_compiles_for_one_v5e_chip():
  from hamburger_jax.model.config import get_preset
  cfg = get_preset("tiny")
  base = dataclasses.replace(cfg.base, num_layers=4, dtype="bfloat16", param_dtype="bfloat16")
  cfg = cfg.replace(base=base, feature_layers=(0, 1, 2), num_micro_layers=1, merger_heads=4)
  device = aot.topology_devices("v5e:2x2", 1)[0]
  _check_loop_report(aot.compile_decode_loop(cfg, device, batch=8, cache_length=256))


@pytest.mark.slow
def test_verified_decode_loop_compiles_for_one_v5e_chip(verified_loops):
  _check_loop_report(verified_loops[0])


def test_matmul_flops_weight_loop_bodies_by_trip_count():
  import jax
  import jax.numpy as jnp
  from hamburger_jax.train import hlo_flops
  device = aot.topology_devices("v5e:2x2", 1)[0]
  spec = jax.sharding.SingleDeviceSharding(device)

  def f(x, w):                     # 6 scanned matmuls [256, 512] x [512, 512], then one more
    y, _ = jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)
    return y @ w[0]

  args = (jax.ShapeDtypeStruct((256, 512), jnp.bfloat16, sharding=spec),
          jax.ShapeDtypeStruct((6, 512, 512), jnp.bfloat16, sharding=spec))
  compiled = jax.jit(f).lower(*args).compile()
  count = hlo_flops.matmul_flops(compiled.as_text())
  one = 2 * 256 * 512 * 512
  assert count["loops"] == [6], count
  assert count["flops"] == 7 * one, count
  assert count["flops_once"] == 2 * one, count
  xla = aot.memory_report(compiled)["flops"]      # XLA's count: the loop body once
  assert 2 * one <= xla < 3 * one, (xla, count)


@pytest.mark.slow
def test_a_draft_vocabulary_cuts_the_verified_steps_bytes_on_a_v5e_chip(verified_loops):
  full, small = verified_loops[0], verified_loops[256]
  assert full["fits"] and small["fits"], (full, small)
  # Each of the 3 drafting micro steps reads 256 + REST_SAMPLE rows of the head, not 8,192.
  base = _draft_vocab_config().base
  head = base.vocab_size * base.hidden_size * 2
  assert small["bytes"]["hbm_step"] < full["bytes"]["hbm_step"] - 2 * head, (small, full)
  floors = [r["bytes"]["floor"] for r in (full, small)]
  assert floors[1]["repeats"] < floors[0]["repeats"] / 4, floors


@pytest.mark.slow
def test_int8_kv_buffers_halve_a_base_steps_kv_bytes_on_a_v5e_chip():
  """Two layers of Llama-3.2-1B's widths, 16 rows x 4,096 slots (the KV cache about half a
  step's bytes): int8 buffers are read in place, with no whole-buffer copy per step."""
  from benchmarks.tpu import step_bytes
  from hamburger_jax.model.config import get_preset
  cfg = get_preset("llama3.2-1b", dtype="bfloat16", param_dtype="bfloat16")
  cfg = cfg.replace(base=dataclasses.replace(cfg.base, num_layers=2, vocab_size=8192),
                    feature_layers=(0, 1), num_micro_layers=1)
  device = aot.topology_devices("v5e:2x2", 1)[0]
  plain, int8 = (aot.compile_decode_loop(
      cfg, device, batch=16, cache_length=4096, base=True, kv_cache=kv,
      inspect=step_bytes.inspector(cfg, "base", 16, 4096, kv_cache=kv))["bytes"]
      for kv in ("model", "int8"))
  kv_bytes = lambda b: b["groups"]["hbm"]["kv_cache"]
  assert kv_bytes(int8) < 0.55 * kv_bytes(plain), (int8["groups"], plain["groups"])
  assert int8["groups"]["hbm"]["copies"] < 0.1 * kv_bytes(int8), int8["groups"]
  assert int8["hbm_step"] < 0.8 * plain["hbm_step"], (int8["hbm_step"], plain["hbm_step"])
  assert int8["floor"]["kv_cache"] < 0.55 * plain["floor"]["kv_cache"]


@pytest.mark.slow
def test_an_int8_table_is_read_once_per_step_on_a_v5e_chip():
  """Two layers of Llama-3.2-1B's widths, a 32,768-token table, int8:32z (group scales on the
  tied head), batch 1: the step reads the table once for the head and copies none of it for the
  lookup (stored flat, XLA re-tiled the whole table every step; the group-scaled head wrote a
  scaled copy of it)."""
  from benchmarks.tpu import step_bytes
  from hamburger_jax.model.config import get_preset
  cfg = get_preset("llama3.2-1b", dtype="bfloat16", param_dtype="bfloat16")
  cfg = cfg.replace(base=dataclasses.replace(cfg.base, num_layers=2, vocab_size=32768),
                    feature_layers=(0, 1), num_micro_layers=1)
  device = aot.topology_devices("v5e:2x2", 1)[0]
  report = aot.compile_decode_loop(
      cfg, device, batch=1, cache_length=512, base=True, quantize="int8:32z",
      inspect=step_bytes.inspector(cfg, "base", 1, 512, quantize="int8:32z"))["bytes"]
  table = cfg.base.vocab_size * cfg.base.hidden_size
  assert report["groups"]["hbm"]["copies"] < 0.1 * table, report["groups"]
  assert report["hbm_step"] < 1.1 * report["floor"]["total"], (report["hbm_step"],
                                                                report["floor"])


def test_the_grouped_head_reads_its_int8_table_once_at_64_rows_on_a_v5e_chip():
  """The tied head with group scales at 64 rows (64 x 64 groups: beyond the group-partial form):
  scaled chunk by chunk from blocks, it reads the int8 table about once (the whole scaled table
  was written out and read back: ~7x)."""
  import jax
  import jax.numpy as jnp
  from hamburger_jax.model import int8_table
  from hamburger_jax.train import hlo_bytes
  v, d, n = 32768, 2048, 64
  sharding = jax.sharding.SingleDeviceSharding(aot.topology_devices("v5e:2x2", 1)[0])
  args = [jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for shape, dtype in
          (((64, d), jnp.bfloat16), ((v // int8_table.ROWS, int8_table.ROWS, d), jnp.int8),
           ((v, n), jnp.float32))]
  head = jax.jit(lambda h, t, s: int8_table.grouped_logits(h, t, s, jnp.bfloat16))
  hbm = hlo_bytes.attribute(head.lower(*args).compile().as_text())["hbm"]
  stored = v * d + v * n * 4
  assert hbm < 1.25 * stored, (hbm, stored)
