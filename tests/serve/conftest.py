"""Shared setup of the server tests: a tiny random model, a word tokenizer covering its vocabulary,
and servers on free 127.0.0.1 ports (uvicorn in a thread, or serve.py in a subprocess)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import uvicorn

from hamburger_jax.serve import engines
from hamburger_jax.serve.app import create_app
from hamburger_jax.serve.cli import ServeArgs, service_for
from hamburger_jax.testing.fixtures import CHATML, random_params, tiny_config, write_word_tokenizer
from hamburger_jax.text.tokenizer import Tokenizer

from tests.fixture_paths import REPO
MODEL = "hamburger-tiny"
CACHE_LENGTH = 64
ENGINES = ["serial", "continuous"]
write_tokenizer = write_word_tokenizer      # (directory, vocab_size) -> tokenizer.json path


@pytest.fixture(scope="session")
def tiny_model():
  """(HamburgerConfig, params): 2 layers, vocabulary 256, random weights."""
  cfg = tiny_config(num_layers=2)
  return cfg, random_params(cfg, seed=0)


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory, tiny_model):
  return Tokenizer(write_tokenizer(str(tmp_path_factory.mktemp("tok")),
                                   tiny_model[0].base.vocab_size))


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class ServerThread:
  """uvicorn serving `service` on a free 127.0.0.1 port in a daemon thread."""

  def __init__(self, service):
    self.service = service
    self.port = free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    config = uvicorn.Config(create_app(service), host="127.0.0.1", port=self.port,
                            log_level="warning")
    self.server = uvicorn.Server(config)
    self.thread = threading.Thread(target=self.server.run, daemon=True)

  def __enter__(self) -> "ServerThread":
    self.thread.start()
    deadline = time.monotonic() + 30
    while not self.server.started:
      if time.monotonic() > deadline or not self.thread.is_alive():
        raise RuntimeError("The test server did not start.")
      time.sleep(0.02)
    return self

  def __exit__(self, *exc) -> None:
    self.server.should_exit = True
    self.thread.join(30)


def make_engine(kind: str, cfg, params, **kwargs):
  kwargs = dict(dict(cache_length=CACHE_LENGTH, chunk_steps=4, num_slots=4,
                     eos_ids=tuple(cfg.base.eos_token_ids)), **kwargs)
  return engines.make_engine(kind, cfg, params, **kwargs)


def decode_alone(engine, prompt, max_new_tokens, confidence=0.05):
  """The tokens `engine` answers one request with (submitted alone, stepped to the end)."""
  engine.submit(engines.Request(prompt_ids=prompt, max_new_tokens=max_new_tokens,
                                confidence=confidence))
  tokens = []
  while engine.has_work():
    for event in engine.step():
      tokens += event.new_tokens
  return tokens


@contextlib.contextmanager
def serving(engine, cfg, tokenizer, kind: str = "serial", **args):
  """A ServerThread around `engine` (of `kind`) with ServeArgs(**args) (model id MODEL)."""
  a = ServeArgs(ckpt="tiny", model_id=MODEL, cache_length=CACHE_LENGTH, num_slots=4,
                engine=kind, **args)
  with ServerThread(service_for(engine, cfg, tokenizer, a)) as server:
    yield server


@pytest.fixture(scope="module", params=ENGINES)
def server(request, tiny_model, tokenizer):
  """A server on each available engine (module-scoped: compiled once per test file)."""
  cfg, params = tiny_model
  engine = make_engine(request.param, cfg, params)
  with serving(engine, cfg, tokenizer, request.param, max_queue=64) as s:
    yield s


class GatedEngine:
  """Wraps an engine; `step()` waits until the gate opens (to hold requests in flight)."""

  def __init__(self, engine):
    self.engine = engine
    self.gate = threading.Event()
    self.decode = True
    self.delay_s = 0.0                 # extra seconds per step (a slow engine)
    self.max_prompt_len = engine.max_prompt_len
    self.cancelled: list[int] = []

  def submit(self, request):
    return self.engine.submit(request)

  def cancel(self, request_id):
    self.cancelled.append(request_id)
    self.engine.cancel(request_id)

  def has_work(self):
    return self.engine.has_work()

  def open(self, decode: bool = True) -> None:
    """Lets steps through; with decode=False they return no events (nothing is compiled)."""
    self.decode = decode
    self.gate.set()

  def step(self):
    while not self.gate.wait(0.05):
      pass
    time.sleep(self.delay_s)
    return self.engine.step() if self.decode else []


def run_lm_eval(model: str, model_args: str, task: str, out_dir: str,
                *extra: str) -> subprocess.CompletedProcess:
  """`lm_eval run` on a task of benchmarks/lm_eval_tasks, offline, samples logged to out_dir."""
  env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
             HF_HOME=os.path.join(out_dir, "hf_home"))
  cmd = [sys.executable, "-m", "lm_eval", "run", "--model", model, "--model_args", model_args,
         "--tasks", task, "--include_path", os.path.join(REPO, "benchmarks", "lm_eval_tasks"),
         "--output_path", out_dir, "--log_samples", *extra]
  return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def run_script(*args, **kwargs) -> subprocess.Popen:
  """serve.py in a subprocess on CPU (stdout/stderr piped)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.Popen([sys.executable, os.path.join(REPO, "serve.py"), *args], env=env,
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **kwargs)
