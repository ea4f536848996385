"""`--what greedy_pick`: a greedy decode step's pick over the vocabulary: jnp.argmax against
`sampling.greedy_tokens` (on a CPU the first index where the row's max is met), at the shapes a
decode step picks from with the shipped SmolLM2's vocabulary: [B, V] (a base or HAMburger
step) and [B, 4, V] (a verified step's four positions).

Each shape is timed --repeats times after a compile and a warm-up call, the forms in rotation,
median per call; the table says whether both forms picked the same tokens.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import machine, markdown_table
from hamburger_jax.decode import sampling

VOCAB = 49152
SHAPES = ((1, VOCAB), (8, VOCAB), (1, 4, VOCAB), (8, 4, VOCAB), (32, 4, VOCAB))


def measure(args) -> tuple[dict, str]:
  """-> (result JSON, markdown table) over SHAPES."""
  forms = {"argmax": jax.jit(lambda x: jnp.argmax(x, axis=-1).astype(jnp.int32)),
           "greedy_tokens": jax.jit(sampling.greedy_tokens)}
  inputs = [jax.random.normal(jax.random.PRNGKey(i), shape) for i, shape in enumerate(SHAPES)]
  same = [bool(jnp.all(forms["argmax"](x) == forms["greedy_tokens"](x))) for x in inputs]
  times = {(i, name): [] for i in range(len(SHAPES)) for name in forms}
  for _ in range(args.repeats):
    for i, x in enumerate(inputs):
      for name, fn in forms.items():
        t0 = time.perf_counter()
        jax.block_until_ready(fn(x))
        times[(i, name)].append(time.perf_counter() - t0)
  rows = []
  for i, shape in enumerate(SHAPES):
    a, g = (float(np.median(times[(i, n)]) * 1e3) for n in forms)
    rows.append({"shape": list(shape), "argmax_ms": a, "greedy_tokens_ms": g,
                 "speedup": a / g, "same_tokens": same[i]})
  result = {"rows": rows, "repeats": args.repeats, "backend": jax.default_backend(),
            "machine": machine()}
  return result, markdown_table(
      ["logits", "argmax ms", "greedy_tokens ms", "argmax / greedy_tokens", "same tokens"],
      [["x".join(map(str, r["shape"])), f"{r['argmax_ms']:.2f}", f"{r['greedy_tokens_ms']:.2f}",
        f"{r['speedup']:.2f}", "yes" if r["same_tokens"] else "no"] for r in rows])
