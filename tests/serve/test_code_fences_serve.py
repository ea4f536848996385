"""The server decodes fenced code one token per macro step (ServeArgs.code_fences, on by default):
every request it submits carries the tokenizer's fence ids."""

import asyncio
import os

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from hamburger_jax.serve.cli import ServeArgs, service_for
from hamburger_jax.serve.protocol import ApiError, Settings
from hamburger_jax.serve.worker import QueueFull
from hamburger_jax.text.tokenizer import Tokenizer
from tests.serve.conftest import CACHE_LENGTH, MODEL, make_engine


@pytest.fixture(scope="module")
def fence_tokenizer(tmp_path_factory, tiny_model):
  """Words 0..V-1 where id 20 is "```"."""
  n = tiny_model[0].base.vocab_size
  words = ["<unk>"] + [f"w{i}" for i in range(1, n)]
  words[20] = "```"
  tok = HFTokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  path = os.path.join(str(tmp_path_factory.mktemp("fence_tok")), "tokenizer.json")
  tok.save(path)
  return Tokenizer(path)


class _Recorder:
  """A worker that records the request it is given and answers 'queue full'."""
  request = None

  def submit(self, request, loop):
    del loop
    self.request = request
    raise QueueFull("full")


def _submitted(service, worker):
  service.worker = worker
  settings = Settings(max_tokens=4, temperature=0.0, top_p=1.0, top_k=0, seed=0, confidence=0.8,
                      min_token_prob=0.0, stop=[], stream=False, include_usage=False)

  async def start():
    with pytest.raises(ApiError):
      service.start([1, 2, 3], settings, chat=False)
  asyncio.run(start())
  return worker.request


@pytest.mark.parametrize("code_fences, expected", [(True, (20,)), (False, ())])
def test_requests_carry_the_fence_ids(tiny_model, fence_tokenizer, code_fences, expected):
  cfg, params = tiny_model
  engine = make_engine("serial", cfg, params)
  a = ServeArgs(ckpt="tiny", model_id=MODEL, cache_length=CACHE_LENGTH, engine="serial",
                code_fences=code_fences)
  service = service_for(engine, cfg, fence_tokenizer, a)
  assert service.fence_ids == expected
  assert _submitted(service, _Recorder()).fence_ids == expected
  # the base alone has nothing to merge: no fence ids
  base = service_for(engine, cfg, fence_tokenizer, ServeArgs(
      ckpt="tiny", model_id=MODEL, cache_length=CACHE_LENGTH, engine="serial", base=True))
  assert base.fence_ids == ()
