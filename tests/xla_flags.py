"""The XLA flags tests run with (for compile and run time), and the environment users run with.

`--xla_llvm_disable_expensive_passes` gives the same numbers bit for bit; XLA's backend at
optimisation level 0 moves float results in the last bits (log-probs ~1e-5 apart, the same
tokens), so the README's commands, which are what users run, drop it (`as_users_run`).
docs/results/tests.md has the times.
"""

from __future__ import annotations

import os

SAME_NUMBERS = ("--xla_llvm_disable_expensive_passes=true",)
LAST_BITS = ("--xla_backend_optimization_level=0",)


def add_test_flags(env=os.environ) -> None:
  """Adds both kinds of flags to env's XLA_FLAGS (a flag already set there is kept as set)."""
  for flag in SAME_NUMBERS + LAST_BITS:
    if flag.split("=")[0] not in env.get("XLA_FLAGS", ""):
      env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flag).strip()


def as_users_run(env: dict) -> dict:
  """env without the flags that change numbers."""
  flags = [f for f in env.get("XLA_FLAGS", "").split() if f not in LAST_BITS]
  return dict(env, XLA_FLAGS=" ".join(flags))
