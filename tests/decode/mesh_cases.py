"""Decoding on meshes of fake CPU devices vs one device; run by test_mesh.py in a subprocess
(the device count is fixed when jax starts):

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.decode.mesh_cases

Prints one line "RESULT {json}": per case the tokens (and group sizes) of one device and of
each mesh, the params' and the KV buffer's shardings, and the trace counts around knob changes.
"""

import json
import re
import sys
import time

import jax

jax.config.update("jax_default_matmul_precision", "highest")

from hamburger_jax.decode import loop as loop_lib  # noqa: E402
from hamburger_jax.decode.batching import ContinuousBatcher, Request  # noqa: E402
from hamburger_jax.decode.mesh import make_decode_mesh  # noqa: E402
from hamburger_jax.decode.sampler import DecodeInputError, Sampler  # noqa: E402
from tests.decode.helpers import (CACHE_LENGTH, OUT_LENGTH, drafting_model,  # noqa: E402
                                  small_model)

PROMPTS = [[1, 5, 7, 9], [1, 9], [1, 3, 3, 8, 200, 17, 4], [1, 42, 42]]
KW = dict(cache_length=CACHE_LENGTH, out_length=OUT_LENGTH)   # as small_sampler: shared compiles
COLLECTIVE = re.compile(r"= \S+ (all-gather|all-to-all|collective-permute|all-reduce)\(")
DEVICES = {"tensor=2": 2, "data=2,tensor=2": 4, "tensor=4": 4}


def mesh(spec):
  return make_decode_mesh(spec, jax.devices()[:DEVICES[spec]])


def run(sampler, **knobs):
  r = sampler.decode(PROMPTS, max_new_tokens=16, **knobs)
  return {"tokens": r.tokens, "groups": r.group_sizes}


def merged(out):
  """Greedy merged decoding; the data=2,tensor=2 sampler is kept for `shardings_and_retraces`."""
  cfg, params = small_model(0)
  out["merged"] = {"one": run(Sampler(cfg, params, **KW), confidence=0.6)}
  for spec in ("tensor=2", "data=2,tensor=2"):
    out["sampler"] = Sampler(cfg, params, mesh=mesh(spec), **KW)
    out["merged"][spec] = run(out["sampler"], confidence=0.6)


def verified(out):
  cfg, params = drafting_model()
  out["verified"] = {"one": run(Sampler(cfg, params, verify=True, **KW)),
                     "data=2,tensor=2": run(Sampler(cfg, params, verify=True,
                                                    mesh=mesh("data=2,tensor=2"), **KW))}


def int8_kv(out):
  """Verified decoding with int8 KV buffers (one device, a mesh) and the base with them; the
  buffers' dtypes and the scales' sharding [B, K, L]."""
  cfg, params = drafting_model()
  one = Sampler(cfg, params, verify=True, kv_cache="int8", **KW)
  sharded = Sampler(cfg, params, verify=True, kv_cache="int8", mesh=mesh("data=2,tensor=2"),
                    **KW)
  out["int8_kv"] = {"one": run(one, confidence=0.5),
                    "data=2,tensor=2": run(sharded, confidence=0.5)}
  out["int8_kv_base"] = run(Sampler(cfg, params, base=True, kv_cache="int8", **KW))
  state, _ = sharded.start(PROMPTS, max_new_tokens=4)
  out["int8_kv_dtypes"] = sorted({str(x.dtype) for x in state.cache[0].values()})
  out["int8_kv_scale_spec"] = str(state.cache[0]["k_scale"].sharding.spec)


def kv_collectives(hlo: str) -> list[str]:
  """The lines of a compiled program that move an array shaped like a KV buffer [B, L, K * H]."""
  shape = re.compile(rf"\[\d+,{CACHE_LENGTH},\d+\]")
  return [l.strip()[:200] for l in hlo.splitlines() if COLLECTIVE.search(l) and shape.search(l)]


def shardings_and_retraces(out):
  sampler = out.pop("sampler")
  base = sampler.params["base"]
  state, _ = sampler.start(PROMPTS, max_new_tokens=8)
  state = sampler.run(state)
  spec = lambda x: str(x.sharding.spec)
  shard = lambda x: list(x.addressable_shards[0].data.shape)
  q = base["layers_0"]["self_attn"]["q_proj"]["kernel"]
  out["specs"] = {
      "q_proj": spec(q), "down_proj": spec(base["layers_0"]["mlp"]["down_proj"]["kernel"]),
      "embedding": spec(base["embed_tokens"]["embedding"]), "kv_cache": spec(state.cache[0]["k"]),
      "out_tokens": spec(state.out_tokens), "q_proj_shard": shard(q),
      "kv_cache_shard": shard(state.cache[0]["k"])}
  # The loop moves no KV buffer [B, L, K * H] between devices (no resharding between steps).
  (loop,) = [f for (name, _), f in sampler.executables._compiled.items() if name == "loop"]
  out["kv_collectives"] = kv_collectives(loop.as_text())
  before = dict(loop_lib.TRACE_COUNTS)
  for knobs in (dict(confidence=0.9, max_new_tokens=5), dict(temperature=0.7, top_k=5, seed=3),
                dict(confidence=0.3, max_group=2)):
    sampler.decode(PROMPTS[:3], **{"max_new_tokens": 12, **knobs})
  out["retraces"] = {k: v - before.get(k, 0) for k, v in loop_lib.TRACE_COUNTS.items()}
  cfg, params = small_model(0)
  try:
    Sampler(cfg, params, mesh=mesh("tensor=4"), **KW)
  except DecodeInputError as e:
    out["tensor4_error"] = str(e)


def batching(out):
  cfg, params = small_model(0)
  requests = [Request(prompt_ids=p, max_new_tokens=6 + 3 * i, confidence=0.6)
              for i, p in enumerate(PROMPTS)]
  got = {}
  for name, m in (("one", None), ("data=2,tensor=2", mesh("data=2,tensor=2"))):
    b = ContinuousBatcher(cfg, params, num_slots=2, cache_length=32, chunk_steps=3, mesh=m)
    got[name] = [c.tokens for c in b.generate(requests)]
  out["batching"] = got


def main():
  out = {"devices": jax.device_count()}
  for case in (merged, verified, int8_kv, shardings_and_retraces, batching):
    t0 = time.perf_counter()
    case(out)
    print(f"{case.__name__}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
  print("RESULT " + json.dumps(out))


if __name__ == "__main__":
  main()
