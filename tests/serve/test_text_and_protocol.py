"""Pure helpers of the server (no model): stop strings across pieces, held-back text, request
settings and their defaults."""

from __future__ import annotations

import pytest

from hamburger_jax.serve.protocol import (MAX_PROMPTS, ApiError, Limits, completion_prompts,
                                          parse_settings)
from hamburger_jax.serve.service import usage
from hamburger_jax.serve.text import TextOutput


class _CharTokenizer:
  """Token i is chr(i); 0xFFFD stands for an undecodable partial character."""

  def decode(self, ids):
    return "".join(chr(i) for i in ids)


def _ids(text):
  return [ord(c) for c in text]


def test_stop_string_split_across_pieces_is_never_sent():
  out = TextOutput(_CharTokenizer(), stops=["END", "\n\n"])
  pieces = [out.add(_ids("hello E"), final=False), out.add(_ids("N"), final=False),
            out.add(_ids("D tail"), final=False)]
  # "E", then "EN" are held back (they could start "END") until "END" is complete.
  assert pieces == [("hello ", False), ("", False), ("", True)]


def test_held_back_prefix_is_released_when_no_stop_follows():
  out = TextOutput(_CharTokenizer(), stops=["END"])
  assert out.add(_ids("abcE"), final=False) == ("abc", False)    # "E" could start "END"
  assert out.add(_ids("x"), final=False) == ("Ex", False)
  assert out.add(_ids("yz"), final=True) == ("yz", False)


def test_partial_characters_wait_for_the_next_token():
  out = TextOutput(_CharTokenizer())
  assert out.add([ord("a"), 0xFFFD], final=False) == ("a", False)
  assert out.add([ord("b")], final=True) == ("\ufffdb", False)


def test_token_id_text_without_tokenizer():
  out = TextOutput(None)
  assert out.add([5, 7], final=False) == ("5 7", False)
  assert out.add([9], final=True) == (" 9", False)
  with pytest.raises(ValueError, match="need a tokenizer"):
    TextOutput(None, stops=["x"])


def test_settings_defaults_and_names():
  limits = Limits(max_tokens=64, default_max_tokens=16)
  s = parse_settings({"max_completion_tokens": 8, "top_k": 5, "stop": "x", "seed": 3}, limits)
  assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.seed) == (8, 1.0, 1.0, 5, 3)
  assert s.stop == ["x"] and not s.stream and s.confidence == 0.8
  assert parse_settings({}, limits).max_tokens == 16
  with pytest.raises(ApiError) as e:
    parse_settings({"max_completion_tokens": 65}, limits)
  assert e.value.param == "max_completion_tokens" and "64" in e.value.message
  with pytest.raises(ApiError) as e:
    parse_settings({"temperature": float("nan")}, limits)
  assert e.value.param == "temperature"
  assert parse_settings({}, limits).min_token_prob == 0.0
  trusting = Limits(max_tokens=64, default_max_tokens=16, default_confidence=0.9,
                    default_min_token_prob=0.3)             # a server's (checkpoint's) defaults
  s = parse_settings({}, trusting)
  assert (s.confidence, s.min_token_prob) == (0.9, 0.3)
  s = parse_settings({"confidence": 0.5, "min_token_prob": 0}, trusting)
  assert (s.confidence, s.min_token_prob) == (0.5, 0.0)     # a request's own values win
  assert completion_prompts({"prompt": [1, 2]}) == [[1, 2]]
  assert completion_prompts({"prompt": "hi"}) == ["hi"]
  assert completion_prompts({"prompt": [[1, 2], "hi", [3]]}) == [[1, 2], "hi", [3]]
  for bad in ([], "", [[]], [[1], ""], [1, "a"], [True], [[1]] * (MAX_PROMPTS + 1), {"a": 1}):
    with pytest.raises(ApiError) as e:
      completion_prompts({"prompt": bad})
    assert e.value.param == "prompt"


def test_usage_counts_kv_entries():
  u = usage(prompt_tokens=10, tokens=12, macro_steps=5)
  assert (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) == (10, 12, 22)
  assert u["hamburger"] == {"macro_steps": 5, "tokens_per_macro_step": 2.4, "kv_entries": 14,
                            "kv_entries_base": 21}
