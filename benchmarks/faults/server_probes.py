"""Hostile input replayed against a running serve.py (`fault_injection --target server`).

The probes (`probes`): ordinary requests as controls; very large requests (a chat request with
1,000,000 messages, a 10 MB message, a 10 MB completion prompt, a 10 MB /tokenize body; sizes
times `scale`) and a body one byte over the limit; 1,000-level nested JSON, lone surrogates
("\\ud800" escapes) in chat content, a system message, a completion prompt and /tokenize, invalid
JSON; clients that send partial headers or a partial body and stall, hang up mid-body, or
half-close after their POST. For each (`measure`): the status (or closed / timeout / hung up),
whether an error reply is an OpenAI error object, the latencies of /health requests sent one
after another while the probe is in flight (at least one), the server's VmRSS before and after
and its peak (VmHWM), and the tracebacks its log gained. Then: is the server alive, does it
answer a normal completion.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.common import REPO
from benchmarks.faults import raw_http
from hamburger_jax.testing.fixtures import tiny_config, write_word_tokenizer

MODEL = "bench"
HEALTH_GOAL_S = 0.5               # the most a probe may delay /health
_TEXT = "the cat sat on the mat "


@dataclasses.dataclass(frozen=True)
class Probe:
  """One request. how: 'whole', 'partial_headers' / 'partial_body' (then it stalls), 'hang_up'
  (mid-body) or 'half_close' (after the whole request); expect: the statuses that are right."""
  name: str
  path: str
  body: bytes = b""
  method: str = "POST"
  how: str = "whole"
  expect: tuple = (200,)

  def data(self) -> bytes:
    """The bytes this probe sends."""
    if self.how == "partial_headers":
      return f"{self.method} {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
    whole = raw_http.head(self.method, self.path, len(self.body) if self.method == "POST"
                          else None) + self.body
    if self.how in ("partial_body", "hang_up"):
      return whole[:len(whole) - len(self.body) // 2]
    return whole


def _json(obj) -> bytes:
  """JSON bytes; ensure_ascii sends a lone surrogate as its "\\ud800" escape."""
  return json.dumps(obj, separators=(",", ":")).encode("ascii")


def _text(chars: int) -> str:
  return (_TEXT * (chars // len(_TEXT) + 1))[:chars]


def _chat(*messages, **extra) -> bytes:
  return _json({"model": MODEL, "messages": [{"role": r, "content": c} for r, c in messages],
                **extra})


def _over_limit(limit: int) -> bytes:
  """A completion request of exactly limit + 1 bytes."""
  frame = _json({"model": MODEL, "prompt": ""})
  return frame[:-2] + b"c" * (limit + 1 - len(frame)) + frame[-2:]


def probes(scale: float, max_body_bytes: int) -> list[Probe]:
  """The probe set; `scale` multiplies the large sizes (1.0: 1,000,000 messages, 10 MB)."""
  n, size = max(1, int(1_000_000 * scale)), max(1, int(10_000_000 * scale))
  big, small = (400, 413), _json({"prompt": "the cat sat"})
  return [
      Probe("health", "/health", method="GET"),
      Probe("completion", "/v1/completions",
            _json({"model": MODEL, "prompt": "the cat sat", "max_tokens": 8})),
      Probe("chat", "/v1/chat/completions", _chat(("user", "hello world"), max_tokens=8)),
      Probe("tokenize", "/tokenize", small),
      Probe(f"chat, {n:,} messages", "/v1/chat/completions",
            _chat(*[("user", "hi")] * n, max_tokens=8), expect=big),
      Probe(f"chat, one {size:,}-char message", "/v1/chat/completions",
            _chat(("user", _text(size)), max_tokens=8), expect=big),
      Probe(f"completion, {size:,}-char prompt", "/v1/completions",
            _json({"model": MODEL, "prompt": _text(size), "max_tokens": 8}), expect=big),
      Probe(f"tokenize, {size:,}-char text", "/tokenize", _json({"prompt": _text(size)}),
            expect=(200,) + big),
      Probe("body 1 byte over the limit", "/v1/completions", _over_limit(max_body_bytes),
            expect=(413,)),
      Probe("JSON nested 1,000 deep", "/v1/completions",
            b'{"model":"bench","prompt":' + b"[" * 1000 + b"]" * 1000 + b"}", expect=(400,)),
      Probe("lone surrogate, chat content", "/v1/chat/completions",
            _chat(("user", "a\ud800b")), expect=(400,)),
      Probe("lone surrogate, system message", "/v1/chat/completions",
            _chat(("system", "\udfff"), ("user", "hi")), expect=(400,)),
      Probe("lone surrogate, completion prompt", "/v1/completions",
            _json({"model": MODEL, "prompt": "the \ud800 cat"}), expect=(400,)),
      Probe("lone surrogate, /tokenize", "/tokenize", _json({"prompt": "a\ud800b"}),
            expect=(400,)),
      Probe("invalid JSON", "/v1/completions", b'{"model":"bench","prompt":"the cat',
            expect=(400,)),
      Probe("partial headers, then stall", "/v1/completions", how="partial_headers",
            expect=(raw_http.CLOSED,)),
      Probe("partial body, then stall", "/v1/completions", small, how="partial_body",
            expect=(raw_http.CLOSED,)),
      Probe("hang up mid-body", "/v1/completions", small, how="hang_up",
            expect=(raw_http.HUNG_UP,)),
      Probe("half-close after POST", "/tokenize", small, how="half_close"),
  ]


def is_error_object(reply: raw_http.Reply) -> bool | None:
  """Whether an error reply (>= 400) is an OpenAI error object; None for any other reply."""
  if not isinstance(reply.status, int) or reply.status < 400:
    return None
  body = reply.json()
  err = body.get("error") if isinstance(body, dict) else None
  return (reply.headers.get("content-type", "").startswith("application/json")
          and isinstance(err, dict) and bool(err.get("message"))
          and isinstance(err.get("type"), str) and "param" in err and "code" in err)


class Server:
  """serve.py in a subprocess on a free 127.0.0.1 port, its log in a file.

  flags: serve.py's flags besides --ckpt / --port / --model_id. Without `ckpt`, a random tiny
  checkpoint (`decode.py --make_tiny_checkpoint`) with a word tokenizer is made in a temporary
  folder."""

  def __init__(self, ckpt: str | None, flags: list[str], startup_s: float = 900):
    self.tmp = tempfile.TemporaryDirectory()
    self.ckpt = ckpt or self._tiny(os.path.join(self.tmp.name, "tiny_ckpt"))
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      self.port = s.getsockname()[1]
    self.log_path = os.path.join(self.tmp.name, "serve.log")
    self.log = open(self.log_path, "wb")  # pylint: disable=consider-using-with
    cmd = [sys.executable, os.path.join(REPO, "serve.py"), "--ckpt", self.ckpt,
           "--port", str(self.port), "--model_id", MODEL, *flags]
    self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)
    try:
      self._wait_healthy(startup_s)
    except BaseException:
      self.stop()
      raise

  @staticmethod
  def _tiny(directory: str) -> str:
    subprocess.run([sys.executable, os.path.join(REPO, "decode.py"), "--make_tiny_checkpoint",
                    directory], cwd=REPO, check=True, capture_output=True)
    write_word_tokenizer(directory, tiny_config().base.vocab_size)
    return directory

  def _wait_healthy(self, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
      if self.proc.poll() is not None:
        raise RuntimeError(f"serve.py exited with {self.proc.returncode}: "
                           f"{self.log_text()[-2000:]}")
      if raw_http.get(self.port, "/health", 2).status == 200:
        return
      time.sleep(0.5)
    raise RuntimeError(f"serve.py did not answer /health within {seconds} s")

  def memory_mib(self) -> dict:
    """{"rss": VmRSS, "peak": VmHWM} of the server process in MiB (None once it is gone)."""
    out = {"rss": None, "peak": None}
    try:
      with open(f"/proc/{self.proc.pid}/status") as f:
        for line in f:
          key = {"VmRSS:": "rss", "VmHWM:": "peak"}.get(line.split(":")[0] + ":")
          if key:
            out[key] = round(int(line.split()[1]) / 1024, 1)
    except OSError:
      pass
    return out

  def log_text(self) -> str:
    self.log.flush()
    with open(self.log_path, encoding="utf-8", errors="replace") as f:
      return f.read()

  def alive(self) -> bool:
    return self.proc.poll() is None

  def stop(self) -> int:
    """SIGTERM, then SIGKILL after 60 s -> the exit code."""
    if self.proc.poll() is None:
      self.proc.send_signal(signal.SIGTERM)
      try:
        self.proc.wait(60)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()
    self.log.close()
    self.tmp.cleanup()
    return self.proc.returncode

  def __enter__(self) -> "Server":
    return self

  def __exit__(self, *exc) -> None:
    self.stop()


def send(port: int, probe: Probe, timeout: float, connected: threading.Event) -> raw_http.Reply:
  """Sends `probe` as its `how` says -> the reply (CLOSED when the connection failed)."""
  try:
    return raw_http.exchange(port, probe.data(), timeout, half_close=probe.how == "half_close",
                             hang_up_after_s=0.1 if probe.how == "hang_up" else None,
                             connected=connected)
  except OSError:
    connected.set()
    return raw_http.Reply(raw_http.CLOSED, {}, b"", 0.0)


def _health_while(port: int, busy) -> list[float | None]:
  """GET /health one after another until busy() is false (at least once) -> latencies [s]
  (None: no 200)."""
  latencies = []
  while True:
    reply = raw_http.get(port, "/health", 30)
    latencies.append(round(reply.seconds, 4) if reply.status == 200 else None)
    if not busy():
      return latencies
    time.sleep(0.05)


def measure(server: Server, probe: Probe, timeout: float) -> dict:
  """Sends `probe` while polling /health -> one row of the result (see the module docstring)."""
  before, tracebacks = server.memory_mib(), server.log_text().count("Traceback")
  connected, replies = threading.Event(), []
  worker = threading.Thread(target=lambda: replies.append(
      send(server.port, probe, timeout, connected)), daemon=True)
  worker.start()
  connected.wait(timeout)
  health = _health_while(server.port, worker.is_alive)
  worker.join()
  time.sleep(0.2)                          # what a hang-up logs comes just after it
  reply, after = replies[0], server.memory_mib()
  body = reply.json()
  error = body.get("error") if isinstance(body, dict) else None
  known = [x for x in health if x is not None]
  return {"probe": probe.name, "path": probe.path, "sent_bytes": len(probe.data()),
          "status": reply.status, "expected": list(probe.expect),
          "ok": reply.status in probe.expect, "error_object": is_error_object(reply),
          "error_code": error.get("code") if isinstance(error, dict) else None,
          "seconds": round(reply.seconds, 3), "health_max_s": max(known) if known else None,
          "health_polls": len(health), "health_failed": len(health) - len(known),
          "rss_before_mib": before["rss"], "rss_after_mib": after["rss"],
          "peak_rss_mib": after["peak"],
          "new_tracebacks": server.log_text().count("Traceback") - tracebacks}


def summarize(rows: list[dict], alive: bool, final: dict | None) -> dict:
  """What went wrong, by probe name; passed: no 500, every error an OpenAI error object, every
  status as expected, no traceback logged, the server alive and answering a completion at the
  end. /health over HEALTH_GOAL_S is listed, not failed (timings on a shared machine vary)."""
  errors = [r for r in rows if isinstance(r["status"], int) and r["status"] >= 400]
  latencies = [r["health_max_s"] for r in rows if r["health_max_s"] is not None]
  out = {"probes": len(rows),
         "status_500": [r["probe"] for r in rows if r["status"] == 500],
         "not_error_objects": [r["probe"] for r in errors if not r["error_object"]],
         "unexpected": [r["probe"] for r in rows if not r["ok"]],
         "tracebacks": sum(r["new_tracebacks"] for r in rows),
         "health_max_s": max(latencies, default=None),
         "health_over_goal": [r["probe"] for r in rows if r["health_failed"]
                              or (r["health_max_s"] or 0) > HEALTH_GOAL_S],
         "alive_at_end": alive, "completion_at_end": final["status"] if final else None}
  out["passed"] = (not (out["status_500"] or out["not_error_objects"] or out["unexpected"]
                        or out["tracebacks"]) and alive and out["completion_at_end"] == 200)
  return out


def run(ckpt: str | None, serve_flags: list[str], scale: float, max_body_bytes: int,
        timeout: float) -> dict:
  """Starts serve.py (see `Server`), replays `probes(scale, max_body_bytes)` one at a time, then
  checks it answers a completion -> {"rows", "summary", "rss_start_mib", "rss_end_mib",
  "exit_code", "ckpt"}."""
  with Server(ckpt, serve_flags) as server:
    start = server.memory_mib()
    plan = probes(scale, max_body_bytes)
    rows = [measure(server, p, timeout) for p in plan]
    alive = server.alive()
    control = next(p for p in plan if p.name == "completion")
    final = measure(server, control, timeout) if alive else None
    end = server.memory_mib()
    code = server.stop()
  return {"ckpt": ckpt or "tiny random (decode.py --make_tiny_checkpoint)",
          "summary": summarize(rows, alive, final), "rss_start_mib": start["rss"],
          "rss_end_mib": end["rss"], "peak_rss_mib": end["peak"], "exit_code": code,
          "rows": rows}


def table(rows: list[dict]) -> list[list]:
  """Markdown table rows: probe, request bytes, status, ok, error object, /health max s (polls),
  RSS before -> after, peak RSS, seconds."""
  def mark(x):
    return "-" if x is None else ("yes" if x else "NO")
  return [[r["probe"], f"{r['sent_bytes']:,}", r["status"], mark(r["ok"]),
           mark(r["error_object"]), f"{r['health_max_s']} ({r['health_polls']})",
           f"{r['rss_before_mib']} -> {r['rss_after_mib']}", r["peak_rss_mib"], r["seconds"]]
          for r in rows]


TABLE_HEADER = ["probe", "request bytes", "status", "as expected", "error object",
                "/health max s (polls)", "RSS MiB before -> after", "peak RSS MiB so far", "s"]
