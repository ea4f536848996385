"""`--what dense_forms`: what the base's dense layers cost at R rows in each form XLA's CPU
backend could run them, all compiled with plain dots (`model/cpu_dots.py`):

  dot             x [R, D] @ kernel [D, F], the model's form (a tiled GEMV at 1 row, an Eigen GEMM
                  from 2 rows on)
  dot, [F, D]     the kernels stored transposed, contracted on their last axis
  two halves      each kernel split into two column halves, two independent dots (the runtime
                  may run them on both cores) and a concatenation
  reduction       a multiply and sum over the transposed kernels' last axis (one YNNPACK reduction
                  each, the LM head's form in `layers.attend_rows`)

at the shipped SmolLM2's shapes with random weights (`cpu_dots.dense_layers`: each layer's seven
dots, attention itself left out). A verified forward of W tokens per row runs its dense layers at
W rows per row, so the "dot" column's R-row cost over its 1-row cost bounds verified decoding's
speed-up at batch 1: tokens per forward / that ratio, before any drafting. Every form is checked
against the dot on the same numbers; settings timed in rotation, median per call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import machine, markdown_table
from benchmarks.costs.cpu_dots import (HIDDEN, KV, MLP, NUM_LAYERS, _weights, dense_layers,
                                       median_ms)
from hamburger_jax.model import cpu_dots

ROWS = (1, 2, 4, 8)


def _dot_transposed(x, kernel_t):
  return jax.lax.dot_general(x, kernel_t, (((1,), (1,)), ((), ())))


def _two_halves(x, halves):
  return jnp.concatenate([x @ h for h in halves], axis=-1)


def _reduction(x, kernel_t):
  return jnp.sum(kernel_t[None] * x[:, None, :], axis=-1)


def _halves(kernel):
  half = kernel.shape[1] // 2
  return (jnp.array(kernel[:, :half]), jnp.array(kernel[:, half:]))


FORMS = {   # name: (product, how a [D, F] kernel is stored for it)
    "dot": (jnp.matmul, lambda k: k),
    "dot, [F, D]": (_dot_transposed, lambda k: jnp.array(k.T)),
    "two halves": (_two_halves, _halves),
    "reduction": (_reduction, lambda k: jnp.array(k.T)),
}


def measure(args, rows=ROWS, num_layers: int = NUM_LAYERS, hidden: int = HIDDEN,
            mlp: int = MLP, kv: int = KV) -> tuple[dict, str]:
  """-> (result JSON, markdown table) of every form at every row count."""
  weights = _weights(num_layers, hidden, mlp, kv)
  settings = {}
  for name, (product, store) in FORMS.items():
    stored = [{k: store(w) for k, w in layer.items()} for layer in weights]
    fn = lambda x, ws, product=product: dense_layers(x, ws, product)
    for r in rows:
      x = jax.random.normal(jax.random.PRNGKey(r), (r, hidden), jnp.float32)
      settings[(name, r)] = (cpu_dots.compile_for(jax.jit(fn), (x, stored), "plain"),
                             (x, stored))
  outputs = {key: np.asarray(fn(*fn_args)) for key, (fn, fn_args) in settings.items()}
  diffs = {(name, r): float(np.max(np.abs(out - outputs[("dot", r)])))
           for (name, r), out in outputs.items()}
  ms = median_ms(settings, args.repeats)
  out = [{"rows": r, **{f"{name}_ms": ms[(name, r)] for name in FORMS},
          "max_abs_diff": max(diffs[(name, r)] for name in FORMS)} for r in rows]
  one_row = ms[("dot", rows[0])]
  result = {"rows": out, "forms": list(FORMS), "num_layers": num_layers, "hidden": hidden,
            "mlp": mlp, "kv": kv, "repeats": args.repeats,
            "compiler_options": cpu_dots.COMPILER_OPTIONS, "backend": jax.default_backend(),
            "machine": machine()}
  return result, markdown_table(
      ["rows"] + [f"{name} ms" for name in FORMS] + [f"dot / dot at {rows[0]} row"],
      [[x["rows"]] + [f"{x[f'{name}_ms']:.1f}" for name in FORMS]
       + [f"{x['dot_ms'] / one_row:.2f}"] for x in out])
