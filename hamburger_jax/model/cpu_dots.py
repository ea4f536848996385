"""Which of XLA's CPU code paths a decode program's dots take, and the forms that are fast there.

XLA's CPU backend sends dots and reductions to YNNPACK fusions by default ("ynnpack"). A decode
program can instead be compiled with YNNPACK's dot fusions off and its reduce fusions kept
("plain", `COMPILER_OPTIONS`; the decode engines' default on a CPU): its dots are then plain dot
thunks (a streaming GEMV at one row, an Eigen GEMM from two), which on the 2-core AVX2 machines
measured take a dot of a few rows at far less than YNNPACK's cost, though more than one row's
(docs/results/step_costs.md). A tied LM head of a few rows is faster still as a multiply and
sum over the table, which YNNPACK runs as one reduction: programs traced under `plain()` take
that form from 2 rows on (`layers.attend_rows`).

    compiled = cpu_dots.compile_for(jax.jit(f), args, "plain")

jit caches a function's trace whatever the context it was traced in: trace under `plain()` only
functions jitted for it (`decode.compile_cache.Executables` jits afresh per program).
"""

from __future__ import annotations

import contextlib
import contextvars

MODES = ("ynnpack", "plain")
DEFAULT = "plain"     # on a CPU; other platforms ignore the mode
COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"}
_PLAIN = contextvars.ContextVar("hamburger_jax_plain_cpu_dots", default=False)


def check_mode(mode: str) -> str:
  if mode not in MODES:
    raise ValueError(f"cpu_dots must be one of {MODES}, got {mode!r}.")
  return mode


@contextlib.contextmanager
def plain():
  """Traces inside take the forms that are fast with plain dots (`COMPILER_OPTIONS`)."""
  token = _PLAIN.set(True)
  try:
    yield
  finally:
    _PLAIN.reset(token)


def tracing_plain() -> bool:
  """Whether the program being traced will be compiled with `COMPILER_OPTIONS`."""
  return _PLAIN.get()


def compile_for(jitted, args, mode: str):
  """jitted (a fresh `jax.jit`) lowered on args and compiled for `mode`: "plain" traces under
  `plain()` and compiles with COMPILER_OPTIONS; "ynnpack" as XLA does by default."""
  if mode != "plain":
    return jitted.lower(*args).compile()
  with plain():
    lowered = jitted.lower(*args)
  return lowered.compile(compiler_options=COMPILER_OPTIONS)
