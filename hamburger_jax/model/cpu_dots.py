"""Which of XLA's CPU code paths a decode program's dots take, and the forms that are fast there.

XLA's CPU backend sends dots and reductions to YNNPACK fusions by default ("ynnpack"). A decode
program can instead be compiled with those fusions off ("plain", `COMPILER_OPTIONS`): its dots
are then plain dot thunks, which on the 2-core AVX2 machines measured take a dot of 2-32 rows at
about the cost of reading its weights once, where YNNPACK's take ~2x a 1-row dot
(docs/results/step_costs.md). A multiply-and-sum over a wide table, `attend_rows`' fast form
under YNNPACK, is slow there, so programs traced under `plain()` take a dot instead.

    with cpu_dots.plain():
      lowered = jax.jit(f).lower(*args)
    compiled = lowered.compile(compiler_options=cpu_dots.COMPILER_OPTIONS)

jit caches a function's trace whatever the context it was traced in: trace under `plain()` only
functions jitted for it (`decode.compile_cache.Executables` jits afresh per program).
"""

from __future__ import annotations

import contextlib
import contextvars

MODES = ("ynnpack", "plain")
COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}
_PLAIN = contextvars.ContextVar("hamburger_jax_plain_cpu_dots", default=False)


def check_mode(mode: str) -> str:
  if mode not in MODES:
    raise ValueError(f"cpu_dots must be one of {MODES}, got {mode!r}.")
  return mode


@contextlib.contextmanager
def plain():
  """Traces inside take the forms that are fast with YNNPACK fusions off."""
  token = _PLAIN.set(True)
  try:
    yield
  finally:
    _PLAIN.reset(token)


def tracing_plain() -> bool:
  """Whether the program being traced will be compiled with `COMPILER_OPTIONS`."""
  return _PLAIN.get()
