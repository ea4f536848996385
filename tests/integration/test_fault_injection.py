"""Fault injection (reduced count for CI; `python -m benchmarks.fault_injection --trials 25` runs
the full one): flipped bytes, truncated files, SIGKILL mid-save, a full tmpfs disk (skipped with
the reason where tmpfs cannot be mounted) and a NaN state. No finished step is lost and no
non-finite or altered state is ever restored. `--target server` at 1/100 of its sizes: serve.py
answers every hostile probe without a 500, with OpenAI error objects, and /health meanwhile."""

import collections
import json
import os

import pytest

from benchmarks import fault_injection
from benchmarks.faults import raw_http, server_probes

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


@pytest.mark.slow
def test_the_server_survives_the_hostile_probes(tmp_path, capsys):
  out = tmp_path / "hostile_input.json"
  code = fault_injection.main(["--target", "server", "--scale", "0.01", "--engine", "serial",
                               "--header_timeout", "1", "--body_timeout", "1", "--out", str(out)])
  result = json.loads(out.read_text())
  rows, summary = result["rows"], result["summary"]
  assert len(rows) == len(server_probes.probes(0.01, 1 << 20))
  assert not [r for r in rows if r["status"] == 500], rows
  errors = [r for r in rows if isinstance(r["status"], int) and r["status"] >= 400]
  assert len(errors) >= 10 and all(r["error_object"] for r in errors), errors
  assert all(r["health_polls"] >= 1 and r["health_max_s"] is not None for r in rows), rows
  assert summary["alive_at_end"] and summary["completion_at_end"] == 200, summary
  assert code == 0 and summary["passed"], summary
  assert result["provenance"]["command"].endswith(str(out))
  assert "| lone surrogate, /tokenize | " in capsys.readouterr().out


def test_a_reply_is_parsed_and_checked_for_an_error_object():
  body = b'{"error":{"message":"too big","type":"invalid_request_error","param":null,"code":null}}'
  reply = raw_http.parse(b"HTTP/1.1 413 Request Entity Too Large\r\ncontent-type: application/json"
                         b"\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body), 0.1)
  assert reply.status == 413 and server_probes.is_error_object(reply)
  plain = raw_http.parse(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\n"
                         b"\r\nInternal Server Error", 0.1)
  assert plain.status == 500 and server_probes.is_error_object(plain) is False
  assert raw_http.parse(b"", 0.1).status == raw_http.CLOSED
  assert server_probes.is_error_object(raw_http.parse(b"HTTP/1.1 200 OK\r\n\r\n{}", 0.1)) is None


@pytest.mark.parametrize("flags", [["--target", "server", "--trials", "3"], ["--scale", "0.5"],
                                   ["--target", "server", "--scale", "0"]])
def test_flags_of_the_other_target_are_refused(flags, capsys):
  with pytest.raises(SystemExit):
    fault_injection.main(flags)
  assert "--" in capsys.readouterr().err
