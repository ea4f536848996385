"""Chat templates, over-long rules, empty responses, LM mode and the self-distillation hook."""

import collections

import numpy as np
import pytest

from hamburger_jax.data.distill import self_distill
from hamburger_jax.data.sources import DataError, RawExample
from hamburger_jax.data.tokenize import (ChatTokenizer, TokenizeConfig, TokenizedExample,
                                         fit_length, tokenize_examples)


def _tok(path, **kw):
  return ChatTokenizer(TokenizeConfig(path, **kw))


def test_templates_are_detected_from_the_vocabulary(tokenizer_files):
  llama = _tok(tokenizer_files["llama3"])
  assert llama.template == "llama3"
  assert llama.decode(llama.encode_prompt("Hi?")) == (
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n")
  assert llama.decode(llama.encode_response("Yes.")) == "Yes.<|eot_id|>"
  chatml = _tok(tokenizer_files["chatml"])
  assert chatml.template == "chatml"
  assert chatml.decode(chatml.encode_prompt("Hi?")) == (
      "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n")
  assert chatml.decode(chatml.encode_response("Yes.")) == "Yes.<|im_end|>"
  plain = _tok(tokenizer_files["plain"])
  assert plain.template == "plain"
  assert plain.decode(plain.encode_prompt("Hi?")) == "<s>User: Hi?\nAssistant:"
  assert plain.decode(plain.encode_response("Yes.")) == " Yes.</s>"
  with pytest.raises(DataError, match="needs the special tokens"):
    _tok(tokenizer_files["plain"], template="llama3")


def test_system_and_multi_turn(tokenizer_files):
  llama = _tok(tokenizer_files["llama3"], system_prompt="Be brief.")
  text = llama.decode(llama.encode_prompt([
      {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
      {"role": "user", "content": "c"}]))
  assert text == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief."
                  "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\na<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nb<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nc<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n")
  # A record's own system message wins over the configured default.
  own = llama.decode(llama.encode_prompt("q", system="Own."))
  assert "Own." in own and "Be brief." not in own


def test_special_tokens_in_user_text_stay_text(tokenizer_files):
  llama = _tok(tokenizer_files["llama3"])
  eot = llama.tok.token_to_id("<|eot_id|>")
  ids = llama.encode_prompt("fake <|eot_id|> end")
  assert ids.count(eot) == 1                       # only the template's own end of turn
  assert "fake <|eot_id|> end" in llama.decode(ids)


def test_fit_length_rules():
  counters = collections.Counter()
  cfg = TokenizeConfig("unused", max_length=6)
  assert fit_length([1, 2], [3, 4, 5], cfg, counters) == [([1, 2], [3, 4, 5])]
  assert fit_length([1, 2], [3, 4, 5, 6, 7], cfg, counters) == [([1, 2], [3, 4, 5, 6])]
  assert counters["truncated"] == 1
  drop = TokenizeConfig("unused", max_length=6, overlong="drop")
  assert fit_length([1, 2], [3, 4, 5, 6, 7], drop, counters) == []
  assert counters["skipped_overlong"] == 1
  assert fit_length([1] * 6, [3], cfg, counters) == []
  assert counters["skipped_prompt_too_long"] == 1
  assert fit_length([1], [], cfg, counters) == []
  assert counters["skipped_empty_response"] == 1
  split = TokenizeConfig("unused", mode="lm", max_length=4, overlong="split")
  assert fit_length([9], list(range(7)), split, counters) == [
      ([9], [0, 1, 2]), ([9], [3, 4, 5]), ([9], [6])]
  with pytest.raises(ValueError, match="lm mode"):
    TokenizeConfig("unused", overlong="split")


def test_tokenize_counts_empty_and_long(tokenizer_files):
  tok = _tok(tokenizer_files["llama3"], max_length=40)
  raws = [RawExample("q", "fine", None, "f:1"), RawExample("q", "   ", None, "f:2"),
          RawExample("q", "a long answer " * 20, None, "f:3")]
  counters = collections.Counter()
  out = list(tokenize_examples(raws, tok, counters))
  assert [ex.origin for ex in out] == ["f:1", "f:3"]
  assert counters["skipped_empty_response"] == 1 and counters["truncated"] == 1
  assert all(len(ex.prompt) + len(ex.response) <= 40 for ex in out)
  assert len(out[1].prompt) + len(out[1].response) == 40
  assert all(ex.prompt.dtype == np.int32 and ex.response.dtype == np.int32 for ex in out)
  assert out[0].response[-1] == tok.eos_id


def test_lm_mode(tokenizer_files):
  tok = _tok(tokenizer_files["plain"], mode="lm", max_length=8, overlong="split")
  assert tok.template == "lm"
  out = list(tokenize_examples([RawExample(None, "one two three four five six", None, "t:1")],
                               tok))
  assert len(out) > 1 and all(ex.prompt.tolist() == [tok.bos_id] for ex in out)
  joined = np.concatenate([ex.response for ex in out]).tolist()
  assert tok.decode(joined) == "one two three four five six</s>"
  with pytest.raises(DataError, match="BOS"):
    _tok(tokenizer_files["chatml"], mode="lm")
  chatml = _tok(tokenizer_files["chatml"], mode="lm", bos_token="<|endoftext|>")
  assert chatml.encode_prompt(None) == [chatml.bos_id]


def test_self_distill_replaces_responses():
  cfg = TokenizeConfig("unused", max_length=8)
  examples = [TokenizedExample(np.array([1, 2 + i], np.int32), np.array([7], np.int32), f"x:{i}")
              for i in range(5)]
  calls = []

  def generate(prompts):
    calls.append(len(prompts))
    # Answer: the prompt reversed and repeated (prompt [1, 3] gets nothing: an empty answer).
    return [[] if p[1] == 3 else (p[::-1] * 4) for p in prompts]

  counters = collections.Counter()
  out = list(self_distill(examples, generate, cfg, batch_size=2, counters=counters))
  assert calls == [2, 2, 1]
  assert [ex.origin for ex in out] == ["x:0", "x:2", "x:3", "x:4"]
  assert out[0].response.tolist() == [2, 1, 2, 1, 2, 1]        # truncated to max_length - 2
  assert counters["skipped_empty_distilled"] == 1 and counters["truncated"] == 4
  with pytest.raises(ValueError, match="answers"):
    list(self_distill(examples, lambda p: [], cfg))
