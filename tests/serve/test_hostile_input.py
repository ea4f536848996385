"""Hostile clients: oversized bodies (413), deep nesting and lone surrogates (400 naming the field),
text far over the context (400 before tokenizing), unforeseen failures (500 as an OpenAI error
object), stalled, vanishing and half-closed connections; /health answers within 0.5 s while a big
request is worked on."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import socket
import threading
import time

import httpx2
import pytest
import uvicorn

from hamburger_jax.serve import protocol
from hamburger_jax.serve.app import MAX_BODY_BYTES, create_app
from hamburger_jax.serve.cli import ServeArgs, service_for
from hamburger_jax.serve.http import uvicorn_options
from hamburger_jax.serve.service import CHARS_PER_TOKEN

from tests.serve.conftest import CACHE_LENGTH, MODEL, free_port, make_engine

_TRACEBACK = "Exception in ASGI application"
_TIMEOUT_S = 0.5                       # header / body read deadlines of these servers


class _Server:
  """uvicorn with the guards of serve/http.py in a thread; logs reach pytest's caplog."""

  def __init__(self, service, max_body_bytes: int):
    self.service, self.port = service, free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    config = uvicorn.Config(create_app(service, max_body_bytes), host="127.0.0.1",
                            port=self.port, log_config=None, log_level="info",
                            **uvicorn_options(header_timeout_s=_TIMEOUT_S,
                                              body_timeout_s=_TIMEOUT_S))
    self.server = uvicorn.Server(config)
    self.thread = threading.Thread(target=self.server.run, daemon=True)

  def __enter__(self):
    self.thread.start()
    deadline = time.monotonic() + 30
    while not self.server.started:
      assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
      time.sleep(0.02)
    return self

  def __exit__(self, *exc):
    self.server.should_exit = True
    self.thread.join(30)


@contextlib.contextmanager
def _serving(tiny_model, tokenizer, max_body_bytes=MAX_BODY_BYTES):
  cfg, params = tiny_model
  a = ServeArgs(ckpt="tiny", model_id=MODEL, cache_length=CACHE_LENGTH, engine="serial")
  with _Server(service_for(make_engine("serial", cfg, params), cfg, tokenizer, a),
               max_body_bytes) as server:
    yield server


@pytest.fixture(scope="module")
def server(tiny_model, tokenizer):
  with _serving(tiny_model, tokenizer) as s:
    yield s


def _post(server, path, body=None, raw=None, **kw):
  content = raw if raw is not None else json.dumps(body).encode()
  return httpx2.post(server.url + path, content=content, timeout=60,
                     headers={"Content-Type": "application/json"}, **kw)


def _error(response, status, param=None, code=None):
  assert response.status_code == status, response.text
  assert response.headers["content-type"].startswith("application/json")
  err = response.json()["error"]
  assert err["message"] and err["type"] and err["param"] == param
  if code is not None:
    assert err["code"] == code
  return err


def _chat(content, **extra):
  return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def test_a_body_over_the_limit_is_413(server):
  big = _chat("cat " * (MAX_BODY_BYTES // 4 + 10))
  _error(_post(server, "/v1/chat/completions", big), 413, code="request_too_large")
  _error(_post(server, "/tokenize", {"prompt": "x" * (MAX_BODY_BYTES + 1)}), 413)
  chunks = (b" " * 65536 for _ in range(MAX_BODY_BYTES // 65536 + 2))      # no Content-Length
  _error(_post(server, "/v1/completions", raw=chunks), 413)
  assert httpx2.get(server.url + "/health").status_code == 200


def test_deep_nesting_is_400(server):
  deep = b'{"model": "x", "prompt": ' + b"[" * 1000 + b"]" * 1000 + b"}"
  assert "nests" in _error(_post(server, "/v1/completions", raw=deep), 400)["message"]
  nested = {"model": MODEL, "prompt": [1, 5], "user": json.loads("[" * 40 + "]" * 40)}
  _error(_post(server, "/v1/completions", nested), 400)
  _error(_post(server, "/tokenize", raw=b'{"prompt": ' + b"{\"a\":" * 900 + b"1" + b"}" * 901),
         400)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", _chat("a\ud800b"), "messages[0].content"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "system", "content": "\udfff"}, {"role": "user", "content": "hi"}]},
     "messages[0].content"),
    ("/v1/chat/completions", _chat([{"type": "text", "text": "x\ud83d"}]), "messages[0].content"),
    ("/v1/completions", {"model": MODEL, "prompt": "the \ud800 cat"}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": ["cat", "\ud800"]}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "cat", "stop": ["\ud800"]}, "stop"),
    ("/tokenize", {"prompt": "a\ud800b"}, "prompt"),
])
def test_lone_surrogates_are_400_naming_the_field(server, path, body, param):
  err = _error(_post(server, path, body), 400, param)
  assert "lone surrogate" in err["message"]


def test_an_unknown_model_with_a_surrogate_is_404(server):
  _error(_post(server, "/v1/completions", {"model": "\ud800", "prompt": [1]}), 404, "model")


def test_text_far_over_the_context_is_refused_before_tokenizing(server, monkeypatch):
  tok = server.service.tokenizer
  monkeypatch.setattr(tok, "encode", lambda *a, **k: pytest.fail("tokenized"))
  limit = CHARS_PER_TOKEN * server.service.max_prompt_len
  err = _error(_post(server, "/v1/chat/completions", _chat("c" * (limit + 1))), 400, "messages",
               "context_length_exceeded")
  assert f"{limit + 1} characters" in err["message"]
  _error(_post(server, "/v1/completions", {"model": MODEL, "prompt": "c" * (limit + 1)}), 400,
         "prompt", "context_length_exceeded")
  many = {"model": MODEL, "messages": [{"role": "user", "content": ""}] * (CACHE_LENGTH + 1)}
  _error(_post(server, "/v1/chat/completions", many), 400, "messages", "context_length_exceeded")
  tokenize = _post(server, "/tokenize", {"prompt": "c" * (server.service.max_tokenize_chars + 1)})
  _error(tokenize, 400, "prompt")


def test_an_unforeseen_failure_is_a_500_error_object(server, monkeypatch):
  def broken(*args):
    raise RuntimeError("boom")
  monkeypatch.setattr(server.service, "prepare", broken)
  err = _error(_post(server, "/v1/completions", {"model": MODEL, "prompt": [1]}), 500)
  assert err["type"] == "server_error" and "RuntimeError" in err["message"]


def _health_latencies(server, work, seconds_at_least=0.0):
  """Runs work() in a thread and polls /health meanwhile -> (work's result, latencies [s]). The
  cyclic GC waits meanwhile: a full collection of this test process's heap (every test before
  it) stops all threads alike, a pause no endpoint causes."""
  result, latencies = [], []
  thread = threading.Thread(target=lambda: result.append(work()))
  start = time.monotonic()
  gc.disable()
  try:
    thread.start()
    with httpx2.Client(timeout=30) as client:
      while thread.is_alive() or time.monotonic() - start < seconds_at_least:
        t0 = time.monotonic()
        assert client.get(server.url + "/health").status_code == 200
        latencies.append(time.monotonic() - t0)
        time.sleep(0.05)
    thread.join()
  finally:
    gc.enable()
  return result[0], latencies


def test_health_answers_while_a_slow_tokenization_runs(server, monkeypatch):
  tok = server.service.tokenizer
  real = tok.encode

  def slow(*args, **kwargs):
    time.sleep(2.0)                        # if this ran on the event loop, /health would wait
    return real(*args, **kwargs)
  monkeypatch.setattr(tok, "encode", slow)
  response, latencies = _health_latencies(
      server, lambda: _post(server, "/tokenize", {"prompt": "the cat"}))
  assert response.status_code == 200 and response.json()["count"] == 2, response.text
  assert len(latencies) >= 5 and max(latencies) < 0.5, latencies


def test_health_answers_while_big_requests_are_parsed_and_tokenized(server, monkeypatch):
  text = " ".join(["the cat sat on the mat"] * 40_000)             # ~900K characters
  messages = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}] * 90_000}
  threads = {}                          # what ran -> the threads it ran on

  def recorded(name, fn):
    def run(*args, **kwargs):
      threads.setdefault(name, set()).add(threading.get_ident())
      return fn(*args, **kwargs)
    return run
  monkeypatch.setattr(protocol, "parse_body", recorded("parse", protocol.parse_body))
  tok = server.service.tokenizer
  monkeypatch.setattr(tok, "encode", recorded("tokenize", tok.encode))

  def work():
    return [_post(server, "/tokenize", {"prompt": text}).status_code,
            _post(server, "/v1/chat/completions", messages).status_code]
  start = time.monotonic()
  statuses, latencies = _health_latencies(server, work)
  seconds = time.monotonic() - start
  assert statuses == [200, 400]
  assert set(threads) == {"parse", "tokenize"}, threads
  assert all(server.thread.ident not in ran for ran in threads.values()), "ran on the event loop"
  # A loop blocked by the parse or the tokenization would hold one poll for most of the work.
  assert max(latencies) < max(0.5, 0.25 * seconds), (seconds, latencies)


def _connect(server) -> socket.socket:
  sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
  return sock


def _read_all(sock) -> bytes:
  data = b""
  while chunk := sock.recv(65536):
    data += chunk
  return data


@pytest.mark.parametrize("sent", [
    b"",                                                                  # connects, says nothing
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n",                      # partial headers
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mod",  # part body
])
def test_stalled_clients_are_disconnected(server, caplog, sent):
  with caplog.at_level(logging.INFO), _connect(server) as sock:
    sock.sendall(sent)
    start = time.monotonic()
    assert _read_all(sock) == b""                                        # closed by the server
    assert time.monotonic() - start < _TIMEOUT_S + 5
  time.sleep(0.2)
  assert _TRACEBACK not in caplog.text


def test_a_client_that_hangs_up_mid_body_leaves_no_traceback(server, caplog):
  with caplog.at_level(logging.INFO):
    with _connect(server) as sock:
      sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
      time.sleep(0.1)
    time.sleep(0.3)
  assert _TRACEBACK not in caplog.text and "Traceback" not in caplog.text
  assert httpx2.get(server.url + "/health").status_code == 200


def test_a_half_closed_client_gets_its_reply(server):
  body = json.dumps({"prompt": "the cat sat"}).encode()
  with _connect(server) as sock:
    sock.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    sock.shutdown(socket.SHUT_WR)
    reply = _read_all(sock)
  head, _, payload = reply.partition(b"\r\n\r\n")
  assert head.startswith(b"HTTP/1.1 200"), reply[:500]
  assert json.loads(payload)["count"] == 3


def test_a_small_body_limit_is_configurable(tiny_model, tokenizer):
  with _serving(tiny_model, tokenizer, max_body_bytes=200) as small:
    _error(_post(small, "/v1/completions", {"model": MODEL, "prompt": "cat " * 60}), 413)
    ok = _post(small, "/tokenize", {"prompt": "cat " * 40})
    assert ok.status_code == 200 and ok.json()["count"] == 40, ok.text
