"""`--what cpu_dots`: XLA's two CPU code paths for a decode step's dots (`model/cpu_dots.py`),
at the shipped SmolLM2's shapes (random weights) and R rows (R = batch x tokens per row):

  dense    the base's dense layers: per layer the q, k, v, o projections and the SwiGLU MLP's
           three dots, NUM_LAYERS layers in a row, [R, 576] in
  LM head  the tied head [R, 576] x [49152, 576]^T in the form each path traces
           (`layers.attend_rows`)

each compiled with XLA's defaults ("ynnpack") and with plain dots ("plain"). Every
setting is timed --repeats times after a compile and a warm-up call, the settings in rotation,
median per call.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import machine, markdown_table
from hamburger_jax.model import cpu_dots, layers

ROWS = (1, 2, 4, 8, 16, 24, 32)
HIDDEN, MLP, KV, VOCAB, NUM_LAYERS = 576, 1536, 192, 49152, 30    # SmolLM2-135M


def _weights(num_layers: int, hidden: int, mlp: int, kv: int):
  shapes = dict(q=(hidden, hidden), k=(hidden, kv), v=(hidden, kv), o=(hidden, hidden),
                gate=(hidden, mlp), up=(hidden, mlp), down=(mlp, hidden))
  key = iter(jax.random.split(jax.random.PRNGKey(0), num_layers * len(shapes)))
  return [{n: jax.random.normal(next(key), s, jnp.float32) * 0.02 for n, s in shapes.items()}
          for _ in range(num_layers)]


def dense_layers(x, weights, product=jnp.matmul):
  """x [R, D] through each layer's seven products (attention itself left out) -> [R, D];
  product(x, kernel) -> x @ kernel, the kernel stored as that form takes it (`dense_forms`)."""
  for w in weights:
    q, k, v = product(x, w["q"]), product(x, w["k"]), product(x, w["v"])
    reps = q.shape[-1] // k.shape[-1]
    x = x + product(q + jnp.tile(k, (1, reps)) + jnp.tile(v, (1, reps)), w["o"])
    x = x + product(jax.nn.silu(product(x, w["gate"])) * product(x, w["up"]), w["down"]) * 1e-3
  return x


def _compiled(fn, args, mode: str):
  """fn jitted afresh, traced and compiled for `mode` ("ynnpack" or "plain")."""
  return cpu_dots.compile_for(jax.jit(lambda *a: fn(*a)), args, mode)


def median_ms(settings: dict, repeats: int) -> dict:
  """{key: (compiled fn, its args)} -> {key: median ms per call}, timed `repeats` times each,
  the settings in rotation."""
  times = {key: [] for key in settings}
  for _ in range(repeats):
    for key, (fn, fn_args) in settings.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*fn_args))
      times[key].append(time.perf_counter() - t0)
  return {key: float(np.median(t) * 1e3) for key, t in times.items()}


def measure(args, rows=ROWS, num_layers: int = NUM_LAYERS, hidden: int = HIDDEN,
            mlp: int = MLP, kv: int = KV, vocab: int = VOCAB) -> tuple[dict, str]:
  """-> (result JSON, markdown table) over `rows`."""
  weights = _weights(num_layers, hidden, mlp, kv)
  table = jax.random.normal(jax.random.PRNGKey(1), (vocab, hidden), jnp.float32) * 0.02
  settings = {}
  for r in rows:
    x = jax.random.normal(jax.random.PRNGKey(r), (r, hidden), jnp.float32)
    for mode in cpu_dots.MODES:
      settings[(r, "dense", mode)] = (_compiled(dense_layers, (x, weights), mode), (x, weights))
      settings[(r, "head", mode)] = (_compiled(layers.attend_rows, (x, table), mode), (x, table))
  diffs = {}
  for r in rows:
    for part in ("dense", "head"):
      outs = [np.asarray(settings[(r, part, m)][0](*settings[(r, part, m)][1]))
              for m in cpu_dots.MODES]
      diffs[(r, part)] = float(np.max(np.abs(outs[0] - outs[1])))
  ms = median_ms(settings, args.repeats)
  out = [{"rows": r, **{f"{part}_{mode}_ms": ms[(r, part, mode)]
                        for part in ("dense", "head") for mode in cpu_dots.MODES},
          "dense_max_abs_diff": diffs[(r, "dense")], "head_max_abs_diff": diffs[(r, "head")]}
         for r in rows]
  result = {"rows": out, "num_layers": num_layers, "hidden": hidden, "mlp": mlp, "kv": kv,
            "vocab": vocab, "repeats": args.repeats, "compiler_options": cpu_dots.COMPILER_OPTIONS,
            "backend": jax.default_backend(), "machine": machine()}
  return result, markdown_table(
      ["rows", "dense ynnpack ms", "dense plain ms", "plain / ynnpack", "head ynnpack ms",
       "head plain ms", "plain / ynnpack"],
      [[x["rows"], f"{x['dense_ynnpack_ms']:.1f}", f"{x['dense_plain_ms']:.1f}",
        f"{x['dense_plain_ms'] / x['dense_ynnpack_ms']:.2f}", f"{x['head_ynnpack_ms']:.1f}",
        f"{x['head_plain_ms']:.1f}", f"{x['head_plain_ms'] / x['head_ynnpack_ms']:.2f}"]
       for x in out])
