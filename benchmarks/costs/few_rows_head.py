"""`--what few_rows_head`: the decode-time LM head at few rows: XLA's dot against
`layers.attend_rows` (a multiply and sum over D on CPU at 2-32 rows), on a table of the shipped
SmolLM2's shape (--vocab x --hidden).

Each setting is timed --repeats times after a compile and a warm-up call, the settings in
rotation, median per call. The table gives the largest difference between the two forms' logits.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import machine, markdown_table
from hamburger_jax.model import layers


def _timed(settings, forms, table, repeats: int) -> dict:
  """(rows, name) -> seconds of every call, settings and forms timed in rotation."""
  times = {(r, name): [] for r, _, _ in settings for name in forms}
  for _ in range(repeats):
    for r, h, _ in settings:
      for name, fn in forms.items():
        t0 = time.perf_counter()
        jax.block_until_ready(fn(h, table))
        times[(r, name)].append(time.perf_counter() - t0)
  return times


def measure(args) -> tuple[dict, str]:
  """-> (result JSON, markdown table) over args.rows."""
  table = jax.random.normal(jax.random.PRNGKey(0), (args.vocab, args.hidden), jnp.float32) * 0.02
  forms = {"dot": jax.jit(lambda h, t: jnp.dot(h, t.T)),
           "attend_rows": jax.jit(layers.attend_rows)}
  settings = []
  for r in args.rows:
    h = jax.random.normal(jax.random.PRNGKey(r), (r, args.hidden), jnp.float32)
    diff = float(jnp.max(jnp.abs(forms["dot"](h, table) - forms["attend_rows"](h, table))))
    settings.append((r, h, diff))
    jax.block_until_ready((forms["dot"](h, table), forms["attend_rows"](h, table)))
  times = _timed(settings, forms, table, args.repeats)
  rows = []
  for r, _, diff in settings:
    d, a = (float(np.median(times[(r, n)]) * 1e3) for n in ("dot", "attend_rows"))
    rows.append({"rows": r, "dot_ms": d, "attend_rows_ms": a, "speedup": d / a,
                 "multiply_and_sum": r in layers.FEW_ROWS, "max_abs_diff": diff})
  result = {"rows": rows, "vocab": args.vocab, "hidden": args.hidden, "repeats": args.repeats,
            "backend": jax.default_backend(), "machine": machine(),
            "load_average": os.getloadavg()}
  return result, markdown_table(
      ["rows", "dot ms", "attend_rows ms", "dot / attend_rows", "multiply and sum", "max |diff|"],
      [[x["rows"], f"{x['dot_ms']:.1f}", f"{x['attend_rows_ms']:.1f}", f"{x['speedup']:.2f}",
        "yes" if x["multiply_and_sum"] else "no", f"{x['max_abs_diff']:.1e}"] for x in rows])
