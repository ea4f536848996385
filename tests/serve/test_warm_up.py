"""The server's warm-up compiles what requests up to --warmup_prompt_tokens need: after `build`,
chat and completion requests of those lengths trace and compile nothing; a longer prompt does."""

from __future__ import annotations

import logging

import httpx2
import pytest

from hamburger_jax.decode.sampler import TRACE_COUNTS
from hamburger_jax.serve import cli
from hamburger_jax.testing.fixtures import make_tiny_checkpoint, write_word_tokenizer

from tests.serve.conftest import MODEL, ServerThread

SYSTEM = "you are a cat sat on the mat one two three red blue"


@pytest.mark.parametrize("engine", ["serial", "continuous"])
def test_requests_up_to_the_warm_up_length_compile_nothing(tmp_path, caplog, engine):
  ckpt = make_tiny_checkpoint(str(tmp_path / "tiny"), num_layers=2)
  write_word_tokenizer(ckpt, 256)
  a = cli.ServeArgs(ckpt=ckpt, model_id=MODEL, engine=engine, cache_length=256, num_slots=2,
                    chunk_steps=4, system=SYSTEM, warmup_prompt_tokens=100)
  with caplog.at_level(logging.INFO, logger=cli.__name__):
    service = cli.build(a)
  assert "prefill of prompts up to 129 tokens" in caplog.text
  assert "Compiled decoding in" in caplog.text
  chat = [{"role": "user", "content": "hello world"}]
  assert len(service.encode_chat(chat)) - 1 > a.min_prompt_bucket   # past a 1-token prompt's
  traces = dict(TRACE_COUNTS)

  def post(route, body):
    r = httpx2.post(server.url + route, timeout=60,
                    json={"model": MODEL, "max_tokens": 3, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]

  with ServerThread(service) as server:
    assert post("/v1/chat/completions", {"messages": chat}) > 17
    for n in (1, 17, 18, 60, 100, 129):
      assert post("/v1/completions", {"prompt": [5] * n}) == n
    assert dict(TRACE_COUNTS) == traces
    post("/v1/completions", {"prompt": [5] * 130})       # the 256-token bucket: not warmed
    assert dict(TRACE_COUNTS) != traces


@pytest.mark.parametrize("min_bucket, up_to, max_len, want", [
    (16, 128, 1024, [17, 33, 65, 129]),
    (16, 100, 1024, [17, 33, 65, 129]),
    (16, 1, 1024, [17]),
    (16, 128, 64, [17, 33, 62]),
    (16, 128, 16, [14]),
    (16, 128, 2, []),
    (8, 20, 1024, [9, 17, 33]),
])
def test_warm_up_lengths_fill_each_bucket_once(min_bucket, up_to, max_len, want):
  assert cli.warm_up_lengths(min_bucket, up_to, max_len) == want


def test_a_bad_warm_up_length_is_refused():
  with pytest.raises(cli.UsageError, match="--warmup_prompt_tokens must be >= 1, got 0"):
    cli.check_args(cli.parse_args(["--ckpt", "smollm2", "--warmup_prompt_tokens", "0"]))
