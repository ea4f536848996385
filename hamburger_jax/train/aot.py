"""Ahead-of-time compilation for TPU topologies from any host (libtpu, no TPU needed).

    devices = topology_devices("v5e:2x4")                 # 8 abstract v5e chips
    report = compile_train_step(config, devices)          # memory per chip, FLOPs, compile s
    report = compile_decode_loop(cfg, devices[:1], batch=8, cache_length=4096)

The XLA TPU compiler plans memory exactly as on the chips: a program that does not fit raises
RESOURCE_EXHAUSTED at compile time; `fits=False` and the message are reported instead.
"""

from __future__ import annotations

import math
import os
import re
import time

import jax
import jax.numpy as jnp

from hamburger_jax.model.batch import BATCH_FIELDS
from hamburger_jax.train import hlo_flops, sharding

GIB = 1024 ** 3
HBM_GIB = {"v4": 32.0, "v5e": 15.75, "v5p": 95.0, "v6e": 31.25}   # usable per chip
PEAK_TFLOPS = {"v4": 275.0, "v5e": 197.0, "v5p": 459.0, "v6e": 918.0}
HBM_GBPS = {"v4": 1200.0, "v5e": 819.0, "v5p": 2765.0, "v6e": 1640.0}   # bandwidth per chip
_ACCELERATOR = {"v4": "v4-8", "v5e": "v5litepod-8", "v5p": "v5p-8", "v6e": "v6e-8"}
_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5": "v5p", "TPU v6 lite": "v6e"}


def libtpu_available() -> bool:
  try:
    import libtpu  # noqa: F401
  except ImportError:
    return False
  return True


def chip_kind(topology: str) -> str:
  return topology.split(":")[0]


def topology_devices(topology: str, num_chips: int | None = None):
  """The abstract chips of a TPU topology name such as 'v5e:2x4' or 'v5p:2x2x2' (first n)."""
  if not libtpu_available():
    raise RuntimeError("TPU compilation needs libtpu: pip install 'libtpu==0.0.42.*' (the "
                       "version jax[tpu] pins for this jax).")
  from jax.experimental import topologies
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", _ACCELERATOR.get(chip_kind(topology), ""))
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")   # compiling only: no chip is opened
  devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
  return list(devices[:num_chips] if num_chips else devices)


def abstract_batch(config, cfg, rows: int, mesh) -> dict:
  """ShapeDtypeStructs of a training batch of `rows` rows, sharded like the real one."""
  m, s = config.data.seq_len, cfg.max_steps
  shapes = {"group_tokens": (rows, m, s), "target_tokens": (rows, m, s)}
  spec = sharding.batch_sharding(mesh)
  return {k: jax.ShapeDtypeStruct(shapes.get(k, (rows, m)), jnp.int32, sharding=spec)
          for k in BATCH_FIELDS}


def memory_report(compiled, hbm_gib: float | None = None) -> dict:
  """Per-chip bytes of XLA's memory plan (GiB), its cost analysis (FLOPs, bytes accessed) and
  the matmul FLOPs of one run with loops weighted by their trips (`hlo_flops`)."""
  mem = compiled.memory_analysis()
  gib = lambda n: n / GIB
  out = {"argument_gib": gib(mem.argument_size_in_bytes),
         "output_gib": gib(mem.output_size_in_bytes),
         "alias_gib": gib(mem.alias_size_in_bytes),
         "temp_gib": gib(mem.temp_size_in_bytes),
         "code_gib": gib(mem.generated_code_size_in_bytes)}
  out["total_gib"] = (out["argument_gib"] + out["output_gib"] - out["alias_gib"]
                      + out["temp_gib"] + out["code_gib"])
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  out["flops"] = float(cost.get("flops", 0.0))        # XLA's count: loop bodies counted once
  out["bytes_accessed"] = float(cost.get("bytes accessed", 0.0))
  count = hlo_flops.matmul_flops(compiled.as_text())   # loop bodies x their trip counts
  out["matmul_flops"], out["loop_trips"] = count["flops"], count["loops"]
  if hbm_gib:
    out["hbm_gib"] = hbm_gib
    out["hbm_free_frac"] = 1.0 - out["total_gib"] / hbm_gib
  return out


def _compile(lowered_fn, hbm_gib, inspect=None):
  """Runs lower+compile -> report dict (fits=False with XLA's message when HBM is exceeded).

  Matmuls keep the TPU's default precision whatever the caller set (a process that asks for
  float32 matmuls everywhere, like the CPU tests, would otherwise ask the Pallas kernels for fp32
  products of bf16 operands, which Mosaic rejects)."""
  t0, c0 = time.perf_counter(), time.process_time()
  try:
    with jax.default_matmul_precision("default"):
      compiled = lowered_fn().compile()
  except Exception as e:   # XLA reports out-of-memory as a runtime error at compile time
    msg = str(e)
    if "RESOURCE_EXHAUSTED" not in msg:
      raise
    needed = re.search(r"required for [^(]*\(([\d.]+)G\)", msg)
    return {"fits": False, "compile_s": time.perf_counter() - t0, "error": msg.splitlines()[0],
            "temp_gib": float(needed.group(1)) if needed else None, "hbm_gib": hbm_gib}
  report = memory_report(compiled, hbm_gib)
  if inspect is not None:                 # inspect(compiled) -> more fields of the report
    report.update(inspect(compiled))
  report.update(fits=report["total_gib"] <= hbm_gib, compile_s=time.perf_counter() - t0,
                compile_cpu_s=time.process_time() - c0)   # all threads: less load-dependent
  return report


def compile_train_step(config, devices) -> dict:
  """AOT-compiles `Setup(config).train_step` on `devices` with the config's full batch."""
  from hamburger_jax.train.run_config import model_config
  from hamburger_jax.train.setup import Setup
  cfg = model_config(config)
  mesh = sharding.make_mesh(config.mesh, devices)
  setup = Setup(config, cfg, mesh)
  batch = abstract_batch(config, cfg, config.data.batch_size, mesh)
  return _compile(lambda: setup.train_step.lower(setup.abstract_state(), batch), hbm_gib(devices))


def chip_name(devices) -> str:
  """'v5e' / 'v5p' / 'v4' / 'v6e' of the devices (their device_kind)."""
  kind = devices[0].device_kind
  if kind not in _KINDS:
    raise ValueError(f"Unknown TPU device kind {kind!r}; known: {sorted(_KINDS)}.")
  return _KINDS[kind]


def hbm_gib(devices) -> float:
  return HBM_GIB[chip_name(devices)]


def _on(device, tree):
  """ShapeDtypeStructs of `tree` committed to one device."""
  spec = jax.sharding.SingleDeviceSharding(device)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=spec), tree)


def tpu_decode_engine(model, cache_length: int, **kwargs):
  """The decode engine as a TPU runs it. Skipping unmerged work defaults to the backend that
  traces it (`decode/compaction.py`: on for a CPU), and a plan is traced on this CPU host, so it
  is set to a TPU's choice, off, as is micro-step compaction."""
  from hamburger_jax.decode import loop as lp
  return lp.DecodeEngine(model, cache_length, cache_length, compact_micro_steps=False,
                         skip_unmerged=False, **kwargs)


def compile_decode_loop(cfg, device, batch: int, cache_length: int, prompt_len: int = 16,
                        base: bool = False, verify: bool = False, inspect=None,
                        quantize: str | None = None, mesh: str | None = None,
                        draft_vocab: int = 0, kv_cache: str = "model",
                        verify_steps: int | None = None, draft_branches: int = 1) -> dict:
  """AOT-compiles the decode loop (`decode.sampler`'s while_loop over macro steps) on one chip.

  cfg: a HamburgerConfig (its dtypes are the params' and the KV cache's); base=True decodes with
  the base model alone (one token per macro step); verify=True is verified decoding
  (`decode/verify.py`: the base reads the pending token and its drafts, S inputs per row).
  Params and the state are abstract. inspect: compiled -> more fields of the report.
  quantize: "int8" = int8 weights with per-channel scales (`model/quantize.py`), the embedding
  in blocks as on a TPU (`model/int8_table.py`).
  mesh: e.g. "tensor=8" over `device`, then a list of chips (`decode/mesh.py`): params and state
  sharded as on the chips; memory and bytes are per chip.
  draft_vocab: K > 0 = drafts choose from K ids (`decode/draft_vocab.py`; ids 0..K-1 stand in
  for a real draft vocabulary, the bytes are the same); the base alone has no drafts.
  kv_cache: what the KV buffers store, "model" or "int8" (`model/kv_cache.py`).
  verify_steps: verified decoding's S (inputs per row and forward; None: cfg.max_steps).
  draft_branches: verified decoding checks a tree of this many draft chains (`draft_tree`).
  """
  from hamburger_jax.decode import loop as lp, state as ds
  from hamburger_jax.decode.mesh import on_mesh
  from hamburger_jax.decode.models import decode_model
  from hamburger_jax.decode.sampling import SamplingParams
  from hamburger_jax.model.hamburger import init_params
  from hamburger_jax.model.quantize import apply_mode
  init = lambda r: init_params(cfg, r)
  params = jax.eval_shape(init, jax.random.PRNGKey(0))
  ids = list(range(draft_vocab)) if draft_vocab and not base else None
  models = []                         # the (static) decode model, built beside its abstract params
  depth = verify_steps if verify else None
  params = jax.eval_shape(lambda p: _keep_first(models, decode_model(cfg, p, base, ids,
                                                                    verify_steps=depth)), params)
  model = models[0]
  params = jax.eval_shape(lambda p: apply_mode(p, model.llama, quantize, blocks=True), params)
  grid = decode_mesh(mesh, device, model)
  engine = tpu_decode_engine(model, cache_length, verify=verify, mesh=grid, kv_cache=kv_cache,
                             draft_branches=draft_branches if verify else 1)
  knobs = ds.DecodeKnobs.make(batch, confidence=0.8, min_token_prob=0.0,
                              max_new_tokens=cache_length, max_group=engine.max_steps,
                              eos_ids=(), sampling=SamplingParams.greedy())
  zeros = jnp.zeros((batch,), jnp.int32)
  state = jax.eval_shape(lambda p: lp.prefill(
      engine, p, jnp.zeros((batch, prompt_len), jnp.int32), zeros, zeros + prompt_len + 1,
      jnp.zeros((batch,), bool), jnp.zeros((batch, 2), jnp.uint32), knobs,
      ds.MicroPolicy.parse("all")), params)
  loop = jax.jit(on_mesh(lp.loop), static_argnums=0, donate_argnums=(2,))
  if grid is None:
    args = _on(device, (params, state, jax.ShapeDtypeStruct((), jnp.int32)))
  else:
    args = _on_mesh(grid, model, params, state)
  report = _compile(lambda: loop.lower(engine, *args), hbm_gib(list(grid.devices.flat) if grid
                                                               else [device]), inspect)
  # Bytes one macro step touches: the loop body's share of the loop's bytes accessed is not
  # separable in XLA's cost model, so this is the whole loop body counted once per iteration.
  report["kv_cache_gib"] = sum(x.size * x.dtype.itemsize
                               for x in jax.tree.leaves(state.cache)) / GIB
  report["param_gib"] = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params)) / GIB
  if grid is not None:
    report.update(mesh=mesh, chips=grid.devices.size,
                  param_gib_per_chip=_per_chip_gib(args[0]),
                  kv_cache_gib_per_chip=_per_chip_gib(args[1].cache))
  return report


def _keep_first(sink: list, pair):
  """(model, params) -> params, the model appended to `sink`."""
  sink.append(pair[0])
  return pair[1]


def decode_mesh(spec: str | None, devices, model):
  """The decode Mesh `spec` over `devices` (None without a spec), checked against the model."""
  if not spec:
    return None
  from hamburger_jax.decode import mesh as mesh_lib
  grid = mesh_lib.make_decode_mesh(spec, devices)
  mesh_lib.check_model_fits(grid, model.llama)
  return grid


def _on_mesh(grid, model, params, state):
  """(params, state, step limit) as ShapeDtypeStructs sharded like decoding on `grid`."""
  from hamburger_jax.decode import mesh as mesh_lib
  put = lambda tree, shardings: jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
  return (put(params, mesh_lib.param_shardings(grid, model.cfg, params)),
          put(state, mesh_lib.state_shardings(grid, state)),
          jax.ShapeDtypeStruct((), jnp.int32, sharding=sharding.replicated(grid)))


def _per_chip_gib(tree) -> float:
  """GiB one chip holds of a tree of sharded ShapeDtypeStructs."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves(tree)) / GIB
