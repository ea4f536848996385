"""Bad requests get clear 4xx OpenAI errors naming the field; a full queue gets 503 with
Retry-After; a request over the timeout is cancelled and answered (408, or an error event)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time

import httpx2
import pytest
from starlette.requests import ClientDisconnect

from hamburger_jax.serve import app as app_module
from hamburger_jax.serve.responses import Formatter
from hamburger_jax.serve.service import Piece

from tests.serve.conftest import CACHE_LENGTH, MODEL, GatedEngine, make_engine, serving


def _post(server, path, body, raw=None):
  return httpx2.post(server.url + path, content=raw if raw is not None else json.dumps(body),
                     headers={"Content-Type": "application/json"}, timeout=60)


def _error(response, status, param=None):
  assert response.status_code == status, response.text
  err = response.json()["error"]
  assert err["message"] and err["type"]
  assert err["param"] == param
  return err


def test_invalid_json_and_unknown_model(server):
  _error(_post(server, "/v1/completions", None, raw=b"{bad json"), 400)
  _error(_post(server, "/v1/completions", [1, 2]), 400)
  err = _error(_post(server, "/v1/chat/completions",
                     {"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}),
               404, "model")
  assert err["code"] == "model_not_found" and MODEL in err["message"]
  _error(_post(server, "/v1/completions", {"prompt": [1, 2]}), 400, "model")
  wrong_method = httpx2.get(server.url + "/v1/completions")
  assert wrong_method.status_code == 405 and "error" in wrong_method.json()


def test_prompt_over_the_buffer_and_outside_the_vocabulary(server):
  long = _post(server, "/v1/completions", {"model": MODEL, "prompt": [3] * (CACHE_LENGTH + 1)})
  assert _error(long, 400, "prompt")["code"] == "context_length_exceeded"
  _error(_post(server, "/v1/completions", {"model": MODEL, "prompt": [1, 256]}), 400, "prompt")
  _error(_post(server, "/v1/completions", {"model": MODEL, "prompt": []}), 400, "prompt")
  long_chat = {"model": MODEL, "messages": [{"role": "user", "content": "cat " * CACHE_LENGTH}]}
  _error(_post(server, "/v1/chat/completions", long_chat), 400, "messages")


@pytest.mark.parametrize("field,value", [
    ("temperature", 2.5), ("temperature", -0.1), ("temperature", "hot"),
    ("top_p", 0), ("top_p", 1.5), ("top_k", -1), ("top_k", 1.5), ("max_tokens", 0),
    ("max_tokens", CACHE_LENGTH + 1), ("max_tokens", True), ("confidence", 0),
    ("confidence", 1.01), ("n", 2), ("seed", -1), ("stop", ["a", "b", "c", "d", "e"]),
    ("stop", ""), ("logprobs", True), ("logprobs", 6), ("echo", 1), ("stream", "yes"),
    ("presence_penalty", 0.5), ("best_of", 3), ("min_token_prob", 1.5), ("min_token_prob", -0.1),
])
def test_knob_out_of_range(server, field, value):
  body = {"model": MODEL, "prompt": [1, 5], field: value}
  err = _error(_post(server, "/v1/completions", body), 400, field)
  assert field in err["message"]


@pytest.mark.parametrize("messages,param", [
    ([], "messages"), ("hi", "messages"), ([{"role": "robot", "content": "hi"}], "messages[0].role"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
     "messages[0].content"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}], "messages"),
])
def test_bad_chat_messages(server, messages, param):
  _error(_post(server, "/v1/chat/completions", {"model": MODEL, "messages": messages}), 400,
         param)


@pytest.fixture(name="gated")
def _gated(tiny_model, tokenizer):
  """A serial server whose engine steps only once opened; 1 slot + 1 queue place."""
  cfg, params = tiny_model
  engine = GatedEngine(make_engine("serial", cfg, params))
  with serving(engine, cfg, tokenizer, max_queue=1, request_timeout=1.0) as server:
    yield server, engine


async def _ask(client, url, **body):
  return await client.post(url + "/v1/completions", json={"model": MODEL, "prompt": [1, 5, 7],
                                                          "max_tokens": 4, **body})


@pytest.mark.slow
def test_full_queue_is_503_with_retry_after(gated):
  server, engine = gated

  async def scenario():
    async with httpx2.AsyncClient(timeout=60) as client:
      first = [asyncio.create_task(_ask(client, server.url))
               for _ in range(2)]
      while server.service.worker.pending < 2:          # both placed (running / queued)
        await asyncio.sleep(0.02)
      rejected = await _ask(client, server.url)
      engine.open()
      return rejected, await asyncio.gather(*first)

  server.service.request_timeout = 60.0
  rejected, accepted = asyncio.run(scenario())
  err = _error(rejected, 503)
  assert err["code"] == "queue_full" and rejected.headers["Retry-After"] == "1"
  assert [r.status_code for r in accepted] == [200, 200]
  assert all(len(r.json()["choices"][0]["token_ids"]) >= 1 for r in accepted)


def test_timeout_cancels_and_answers(gated):
  server, engine = gated
  _error(_post(server, "/v1/completions", {"model": MODEL, "prompt": [1, 5], "max_tokens": 40,
                                            "confidence": 1.0, "temperature": 0}), 408)
  with httpx2.stream("POST", server.url + "/v1/completions", timeout=60,
                     json={"model": MODEL, "prompt": [1, 5], "stream": True}) as r:
    assert r.status_code == 200
    events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
  assert events[-1] == "[DONE]"
  assert json.loads(events[-2])["error"]["code"] == "request_timeout"
  engine.open(decode=False)                             # the worker was held inside step()
  deadline = time.monotonic() + 30
  while server.service.worker.pending and time.monotonic() < deadline:
    time.sleep(0.02)
  assert server.service.worker.pending == 0
  assert len(engine.cancelled) == 2                     # both left the engine
  assert not engine.has_work()


def test_server_without_tokenizer(tiny_model):
  cfg, params = tiny_model
  with serving(make_engine("serial", cfg, params), cfg, None) as server:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    _error(_post(server, "/v1/chat/completions", chat), 400, "messages")
    _error(_post(server, "/v1/completions", {"model": MODEL, "prompt": "hi"}), 400, "prompt")
    ok = _post(server, "/v1/completions", {"model": MODEL, "prompt": [1, 5], "max_tokens": 3})
    choice = ok.json()["choices"][0]
    assert choice["text"] == " ".join(str(t) for t in choice["token_ids"])


_LONG_GREEDY = {"model": MODEL, "prompt": [1, 5], "max_tokens": 60, "confidence": 1.0,
                "temperature": 0}       # 60 steps of 0.2 s; greedy, so no sampled end of text


def _start_slow_decoding(server, engine) -> None:
  server.service.request_timeout = 60.0               # only the hang-up can stop it early
  engine.delay_s = 0.2
  engine.open()


def _assert_cancelled_early(server, engine) -> None:
  deadline = time.monotonic() + 30
  while (server.service.worker.pending or engine.has_work()) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert engine.cancelled == [0]                       # stopped early, not decoded to the end
  assert server.service.worker.pending == 0


def test_client_that_goes_away_is_cancelled(gated):
  server, engine = gated
  _start_slow_decoding(server, engine)
  gc.disable()              # cancelling must not wait for the body generator to be collected
  try:
    with httpx2.stream("POST", server.url + "/v1/completions", json=dict(_LONG_GREEDY, stream=True),
                       timeout=60) as r:
      next(line for line in r.iter_lines() if line.startswith("data: "))   # then hang up
    _assert_cancelled_early(server, engine)
  finally:
    gc.enable()


def test_client_that_stops_waiting_for_a_whole_answer_is_cancelled(gated):
  server, engine = gated
  _start_slow_decoding(server, engine)
  with pytest.raises(httpx2.ReadTimeout):                      # the client gives up and hangs up
    httpx2.post(server.url + "/v1/completions", json=_LONG_GREEDY, timeout=1.0)
  _assert_cancelled_early(server, engine)


class _EndlessRun:
  """A run that never finishes by itself; records cancel()."""

  def __init__(self):
    self.settings = type("Settings", (), {"include_usage": False})()
    self.cancels = 0

  async def pieces(self):
    while True:
      await asyncio.sleep(0.01)
      yield Piece("x", [7])

  def cancel(self):
    self.cancels += 1


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
def test_stream_that_loses_its_client_cancels_the_run(spec_version):
  """ASGI level: the client goes away after two chunks (2.4: send raises; 2.3: a disconnect
  message); the run is cancelled before the response returns, whatever the generator does."""
  run = _EndlessRun()
  response = app_module._RunStream(run, Formatter(False, MODEL))  # pylint: disable=protected-access
  sent, gone = [], asyncio.Event()

  async def send(message):
    if gone.is_set():
      raise OSError("connection lost")
    sent.append(message)
    if len(sent) == 3:                   # the headers and two chunks
      gone.set()

  async def receive():
    await gone.wait()
    return {"type": "http.disconnect"}

  scope = {"type": "http", "asgi": {"spec_version": spec_version}}
  with contextlib.suppress(ClientDisconnect):
    asyncio.run(asyncio.wait_for(response(scope, receive, send), 10))
  assert len(sent) == 3 and sent[1]["body"].startswith(b"data: ")
  assert run.cancels >= 1
