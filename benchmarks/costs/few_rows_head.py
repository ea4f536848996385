r"""The decode-time LM head at few rows: XLA's dot against `layers.attend_rows` (a multiply and sum
over D on CPU at 2-32 rows), on a table of the shipped SmolLM2's shape. One run, one machine.

    python benchmarks/few_rows_head.py                          # rows 1..32, table 49152 x 576
    python benchmarks/few_rows_head.py --rows 2,8 --repeats 50

Each setting is timed --repeats times after a compile and a warm-up call, the settings in
rotation, median per call. Writes JSON (--out) and prints a table with the largest difference
between the two forms' logits.
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report import machine, markdown_table, positive_ints, write_json  # noqa: E402  pylint: disable=import-error
from hamburger_jax.model import layers  # noqa: E402


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rows", type=positive_ints, default="1,2,4,8,12,16,32")
  parser.add_argument("--vocab", type=int, default=49152)
  parser.add_argument("--hidden", type=int, default=576)
  parser.add_argument("--repeats", type=int, default=30)
  parser.add_argument("--out", default="docs/few_rows_head.json")
  args = parser.parse_args(argv)

  table = jax.random.normal(jax.random.PRNGKey(0), (args.vocab, args.hidden), jnp.float32) * 0.02
  dot = jax.jit(lambda h, t: jnp.dot(h, t.T))
  rowwise = jax.jit(layers.attend_rows)
  settings = []
  for r in args.rows:
    h = jax.random.normal(jax.random.PRNGKey(r), (r, args.hidden), jnp.float32)
    diff = float(jnp.max(jnp.abs(dot(h, table) - rowwise(h, table))))
    settings.append((r, h, diff))
    jax.block_until_ready((dot(h, table), rowwise(h, table)))
  times = {(r, name): [] for r, _, _ in settings for name in ("dot", "attend_rows")}
  for _ in range(args.repeats):
    for r, h, _ in settings:
      for name, fn in (("dot", dot), ("attend_rows", rowwise)):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(h, table))
        times[(r, name)].append(time.perf_counter() - t0)
  rows = []
  for r, _, diff in settings:
    d, a = (float(np.median(times[(r, n)]) * 1e3) for n in ("dot", "attend_rows"))
    rows.append({"rows": r, "dot_ms": d, "attend_rows_ms": a, "speedup": d / a,
                 "multiply_and_sum": r in layers.FEW_ROWS, "max_abs_diff": diff})
  result = {"rows": rows, "vocab": args.vocab, "hidden": args.hidden, "repeats": args.repeats,
            "backend": jax.default_backend(), "machine": machine(),
            "load_average": os.getloadavg()}
  write_json(result, args.out)
  print(markdown_table(
      ["rows", "dot ms", "attend_rows ms", "dot / attend_rows", "multiply and sum", "max |diff|"],
      [[x["rows"], f"{x['dot_ms']:.1f}", f"{x['attend_rows_ms']:.1f}", f"{x['speedup']:.2f}",
        "yes" if x["multiply_and_sum"] else "no", f"{x['max_abs_diff']:.1e}"] for x in rows]))
  return result


if __name__ == "__main__":
  main()
