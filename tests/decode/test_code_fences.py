"""Code fences: a group ends after a fence token, and between an opening and a closing fence every
group is one token, so fenced code decodes as the base model reads it (fence ids are traced)."""

import numpy as np
import pytest

from hamburger_jax.decode import loop as loop_lib
from hamburger_jax.decode.batching import ContinuousBatcher, Request
from hamburger_jax.decode.sampler import DecodeInputError
from hamburger_jax.text.tokenizer import Tokenizer
from tests.decode.helpers import CACHE_LENGTH, small_model, small_sampler
from tests.text.test_tokenizer import write_byte_tokenizer, write_word_tokenizer

PROMPTS = [[1, 17, 33, 250, 4], [1, 9, 3, 120, 77, 5, 6, 200, 11]]
KNOBS = dict(max_new_tokens=32, confidence=0.2, eos_ids=[])


def _fence_choice(result):
  """A token that row 0 emits at least twice, first inside a group of >= 2 tokens (not last)."""
  counts = {}
  for t in result.tokens[0]:
    counts[t] = counts.get(t, 0) + 1
  for group in result.groups(0):
    for t in group[:-1]:
      if counts[t] >= 2:
        return t
  pytest.fail("the unfenced answer has no repeated token inside a group: change the prompts")


def _check_fenced(result, row, fences):
  """Every fence token ends its group; between an opening and a closing fence groups are single
  tokens. -> the number of groups decoded inside fences."""
  inside, inside_groups = False, 0
  for group in result.groups(row):
    if inside:
      assert len(group) == 1, f"group {group} inside a fence has {len(group)} tokens"
      inside_groups += 1
    for k, t in enumerate(group):
      if t in fences:
        assert k == len(group) - 1, f"fence {t} is not the last token of {group}"
        inside = not inside
  return inside_groups


@pytest.mark.slow
def test_fenced_code_decodes_one_token_per_step():
  sampler = small_sampler(0)
  free = sampler.decode(PROMPTS, **KNOBS)
  fence = _fence_choice(free)
  fenced = sampler.decode(PROMPTS, fence_ids=[fence], **KNOBS)
  assert fenced.tokens != free.tokens
  assert _check_fenced(fenced, 0, {fence}) >= 3
  for row in range(len(PROMPTS)):
    _check_fenced(fenced, row, {fence})
    # Up to the first fence nothing changes (the fence token itself ends its group there).
    first = free.tokens[row].index(fence) if fence in free.tokens[row] else len(free.tokens[row])
    assert fenced.tokens[row][:first + 1] == free.tokens[row][:first + 1]


def test_fence_ids_are_traced_and_checked():
  sampler = small_sampler(0)
  sampler.decode(PROMPTS, fence_ids=[5], **KNOBS)
  before = dict(loop_lib.TRACE_COUNTS)
  for fences in ([], [7, 9], [11]):
    sampler.decode(PROMPTS, fence_ids=fences, **KNOBS)
  assert dict(loop_lib.TRACE_COUNTS) == before
  with pytest.raises(DecodeInputError, match="At most 32 fence ids"):
    sampler.decode(PROMPTS, fence_ids=list(range(33)), **KNOBS)


@pytest.mark.slow
def test_continuous_batching_keeps_each_rows_fence_state():
  cfg, params = small_model(0)
  sampler = small_sampler(0)
  fence = _fence_choice(sampler.decode(PROMPTS, **KNOBS))
  batcher = ContinuousBatcher(cfg, params, num_slots=2, cache_length=CACHE_LENGTH, chunk_steps=3)
  # More requests than slots: refilled slots must start outside a fence.
  requests = [Request(p, max_new_tokens=32, confidence=0.2, fence_ids=(fence,) if k % 2 == 0
                      else ()) for k, p in enumerate(PROMPTS * 2)]
  got = batcher.generate(requests)
  for k, (request, out) in enumerate(zip(requests, got)):
    alone = sampler.decode([request.prompt_ids], max_new_tokens=32, confidence=0.2,
                           fence_ids=list(request.fence_ids), eos_ids=batcher.eos_ids)
    assert out.tokens == alone.tokens[0], f"request {k}"
  with pytest.raises(DecodeInputError, match="At most 32 fence ids"):
    batcher.submit(Request(PROMPTS[0], fence_ids=tuple(range(33))))


def test_tokenizer_fence_ids(tmp_path):
  assert Tokenizer(write_word_tokenizer(tmp_path, [])).fence_ids() == []
  tok = Tokenizer(write_byte_tokenizer(tmp_path))
  assert tok.fence_ids() == []                         # one byte per token: no token holds ```
  import tokenizers  # pylint: disable=import-outside-toplevel
  hf = tokenizers.Tokenizer.from_file(tok.path)
  hf.add_tokens(["```", " ```"])
  hf.save(tok.path)
  tok = Tokenizer(tok.path)
  assert tok.fence_ids() == sorted([tok.vocab["```"], tok.vocab[" ```"]])

