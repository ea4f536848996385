"""Fault injection (reduced count for CI; `python -m benchmarks.fault_injection --trials 25` runs
the full one): flipped bytes, truncated files, SIGKILL mid-save, a full tmpfs disk (skipped with
the reason where tmpfs cannot be mounted) and a NaN state. No finished step is lost and no
non-finite or altered state is ever restored."""

import collections
import os

import pytest

from benchmarks import fault_injection

TRIALS = int(os.environ.get("FAULT_TRIALS", "10"))


@pytest.mark.slow
def test_no_fault_loses_a_finished_step_or_restores_a_bad_state():
  trials = fault_injection.run_trials(TRIALS, seed=1)
  failed = [t for t in trials if not t["ok"]]
  assert not failed, failed
  kinds = collections.Counter(t["kind"] for t in trials if "skipped" not in t)
  assert set(kinds) >= {"flip", "truncate", "kill", "nan"}, kinds
  for t in trials:
    if t["kind"] in ("flip", "truncate", "kill", "nan") or t.get("restored") is not None:
      assert t["finite"] and t["identical"], t
  assert any(t["kind"] == "nan" and t["refused"] for t in trials)
