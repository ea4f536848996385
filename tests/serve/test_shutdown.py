"""Shutdown: SIGTERM lets in-flight requests finish and exits 0 (serve.py in a subprocess);
draining answers what cannot finish in time; bad command lines exit 2 with one line."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx2
import pytest

from benchmarks import serve_load
from hamburger_jax.testing.fixtures import make_tiny_checkpoint
from tests.serve.conftest import MODEL, GatedEngine, free_port, make_engine, run_script, serving, \
    write_tokenizer


def test_draining_answers_running_requests_and_refuses_new_ones(tiny_model, tokenizer):
  cfg, params = tiny_model
  engine = GatedEngine(make_engine("serial", cfg, params))
  with serving(engine, cfg, tokenizer) as server:
    body = {"model": MODEL, "prompt": [1, 5], "max_tokens": 40, "confidence": 1.0}
    answers = []
    thread = threading.Thread(target=lambda: answers.append(
        httpx2.post(server.url + "/v1/completions", json=body, timeout=60)))
    thread.start()
    while server.service.worker.pending < 1:
      time.sleep(0.02)
    server.service.start_draining(0.3)                 # what SIGTERM does in serve.py
    assert httpx2.get(server.url + "/health").json()["status"] == "draining"
    late = httpx2.post(server.url + "/v1/completions", json=body, timeout=60)
    assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down"
    thread.join(30)
    assert answers[0].status_code == 503                # answered, not dropped
    assert answers[0].json()["error"]["code"] == "shutting_down"
    engine.open(decode=False)


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("serve_ckpt"))
  make_tiny_checkpoint(path, num_layers=2)
  write_tokenizer(path, 256)
  return path


@pytest.mark.slow
def test_sigterm_finishes_in_flight_requests(ckpt_dir):
  port = free_port()
  proc = run_script("--ckpt", ckpt_dir, "--port", str(port), "--engine", "serial",
                    "--cache_length", "64", "--chunk_steps", "1", "--model_id", MODEL)
  url = f"http://127.0.0.1:{port}"
  try:
    serve_load.wait_healthy(proc, url, seconds=300)
    body = {"model": MODEL, "prompt": "the cat sat", "max_tokens": 48, "confidence": 1.0,
            "temperature": 0, "stream": True}
    with httpx2.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
      lines = r.iter_lines()
      first = next(line for line in lines if line.startswith("data: "))
      proc.send_signal(signal.SIGTERM)                  # mid-stream
      rest = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    assert rest[-1] == "[DONE]"
    chunks = [json.loads(first[len("data: "):])] + [json.loads(x) for x in rest[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 48
    assert proc.wait(60) == 0
    assert "Shutting down" in proc.stderr.read()
  finally:
    if proc.poll() is None:
      proc.kill()


@pytest.mark.parametrize("args,message", [
    (["--ckpt", "/no/such/dir"], "No such checkpoint"),
    (["--engine", "warp", "--ckpt", "x"], "--engine must be one of"),
    (["--port", "0", "--ckpt", "x"], "--port"),
    (["--ckpt", "x", "--cache_length", "zero"], "invalid int value"),
    ([], "--ckpt is required"),
])
@pytest.mark.slow
def test_bad_command_lines_exit_2_with_one_line(args, message):
  proc = run_script(*args)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 2, err
  lines = [line for line in err.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
