"""The server through the `openai` Python package on 127.0.0.1: chat, completions, streaming,
usage with HAMburger's statistics, and the same tokens as decoding the request alone."""

from __future__ import annotations

import openai
import pytest

from tests.serve.conftest import CACHE_LENGTH, MODEL
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.serve.service import FINISH


def _client(server) -> openai.OpenAI:
  return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def alone(tiny_model):
  """decode(prompt_ids, max_tokens, stop_ids=()): the same request decoded alone (greedy)."""
  cfg, params = tiny_model
  sampler = Sampler(cfg, params, cache_length=CACHE_LENGTH, out_length=CACHE_LENGTH)

  def decode(prompt_ids, max_tokens, stop_ids=(), confidence=0.5):
    return sampler.decode([prompt_ids], max_new_tokens=max_tokens, confidence=confidence,
                          temperature=0.0, stop_ids=tuple(stop_ids))
  return decode


def _check_usage(usage, prompt_tokens, tokens, steps=None):
  assert usage.prompt_tokens == prompt_tokens and usage.completion_tokens == tokens
  assert usage.total_tokens == prompt_tokens + tokens
  ham = usage.model_extra["hamburger"]
  assert 1 <= ham["macro_steps"] <= tokens
  if steps is not None:
    assert ham["macro_steps"] == steps
  assert ham["tokens_per_macro_step"] == pytest.approx(tokens / ham["macro_steps"], abs=1e-4)
  assert ham["kv_entries"] == prompt_tokens + ham["macro_steps"] - 1
  assert ham["kv_entries_base"] == prompt_tokens + tokens - 1


def test_completion_token_ids_match_decoding_alone(server, alone):
  client = _client(server)
  prompt = [1, 5, 7, 9]
  out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0,
                                  extra_body={"confidence": 0.5})
  ref = alone(prompt, 20)
  choice = out.choices[0]
  assert choice.model_extra["token_ids"] == ref.tokens[0]
  assert choice.finish_reason == FINISH[ref.finish_reasons[0]]
  _check_usage(out.usage, len(prompt), len(ref.tokens[0]), ref.macro_steps[0])
  assert out.usage.model_extra["hamburger"]["macro_steps"] < len(ref.tokens[0])  # groups > 1


def test_chat_text_and_usage(server, alone, tokenizer):
  client = _client(server)
  messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello cat"}]
  out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16,
                                       temperature=0, extra_body={"confidence": 0.5})
  prompt = tokenizer.encode("hello cat", chat=True, system="be brief")
  ref = alone(prompt, 16, stop_ids=tokenizer.stop_ids(chat=True))
  msg = out.choices[0].message
  assert msg.role == "assistant"
  assert msg.content == tokenizer.decode(ref.tokens[0])
  assert out.choices[0].model_extra["token_ids"] == ref.tokens[0]
  _check_usage(out.usage, len(prompt), len(ref.tokens[0]), ref.macro_steps[0])


@pytest.mark.parametrize("chat", [True, False])
def test_streaming_equals_the_whole_response(server, chat):
  client = _client(server)
  kwargs = dict(model=MODEL, max_tokens=24, temperature=0, extra_body={"confidence": 0.5})
  if chat:
    create = client.chat.completions.create
    kwargs["messages"] = [{"role": "user", "content": "the dog sat"}]
  else:
    create = client.completions.create
    kwargs["prompt"] = "the red dog"
  whole = create(**kwargs)
  chunks = list(create(stream=True, stream_options={"include_usage": True}, **kwargs))
  assert len(chunks) >= 3                     # several pieces (chunk_steps=4), then the usage
  usage = chunks[-1].usage
  assert chunks[-1].choices == [] and usage is not None
  pieces = chunks[:-1]
  if chat:
    text = "".join(c.choices[0].delta.content or "" for c in pieces)
    assert pieces[0].choices[0].delta.role == "assistant"
    assert text == whole.choices[0].message.content
  else:
    assert "".join(c.choices[0].text for c in pieces) == whole.choices[0].text
  assert [c.choices[0].finish_reason for c in pieces][-1] == whole.choices[0].finish_reason
  assert all(c.choices[0].finish_reason is None for c in pieces[:-1])
  ids = [t for c in pieces for t in c.choices[0].model_extra["token_ids"]]
  assert ids == whole.choices[0].model_extra["token_ids"]
  assert usage.model_dump() == whole.usage.model_dump()
  assert len({c.id for c in chunks}) == 1


def test_stop_string_cuts_the_text(server):
  client = _client(server)
  kwargs = dict(model=MODEL, prompt="one two three", max_tokens=24, temperature=0)
  full = client.completions.create(**kwargs).choices[0].text
  words = full.split()
  assert len(words) >= 4, full
  stop = " " + words[2]                        # cut before the third generated word
  cut = client.completions.create(stop=[stop], **kwargs)
  assert cut.choices[0].text == full[:full.index(stop)]
  assert cut.choices[0].finish_reason == "stop"
  streamed = client.completions.create(stop=stop, stream=True, **kwargs)
  assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text


def test_models_and_health(server):
  client = _client(server)
  assert [m.id for m in client.models.list()] == [MODEL]
  import httpx2  # pylint: disable=g-import-not-at-top
  health = httpx2.get(server.url + "/health")
  assert health.status_code == 200 and health.json()["status"] == "ok"
  assert health.json()["pending"] == 0
