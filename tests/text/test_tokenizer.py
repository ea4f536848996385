"""The tokenizer wrapper: chat-template detection and encoding, stop ids, streamed text, errors."""

import os

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors

from hamburger_jax.text.tokenizer import TextStream, Tokenizer, TokenizerError

WORDS = ["<unk>", "hello", "world", "user", "assistant", "system", "be", "brief", "the", "a",
         "cat", "sat", "on", "mat", "."]
LLAMA3 = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
          "<|eot_id|>"]
CHATML = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]


def write_word_tokenizer(directory, specials, bos=None) -> str:
  """A whitespace word-level tokenizer.json with `specials` as special tokens (ids after words)."""
  tok = HFTokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.add_special_tokens(specials)
  if bos:
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
  path = os.path.join(str(directory), "tokenizer.json")
  tok.save(path)
  return path


def write_byte_tokenizer(directory) -> str:
  """Byte-level BPE with no merges: one token per UTF-8 byte."""
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  tok = HFTokenizer(models.BPE({c: i for i, c in enumerate(sorted(alphabet))}, []))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  path = os.path.join(str(directory), "tokenizer.json")
  tok.save(path)
  return path


def test_llama3_chat_template_and_stop_ids(tmp_path):
  tok = Tokenizer(write_word_tokenizer(tmp_path, LLAMA3, bos="<|begin_of_text|>"))
  assert tok.chat_format == "llama3"
  v = tok.vocab
  ids = tok.encode("hello world", chat=True)
  assert ids == [v["<|begin_of_text|>"], v["<|start_header_id|>"], v["user"],
                 v["<|end_header_id|>"], v["hello"], v["world"], v["<|eot_id|>"],
                 v["<|start_header_id|>"], v["assistant"], v["<|end_header_id|>"]]
  with_system = tok.encode("hello", chat=True, system="be brief")
  assert with_system[1:4] == [v["<|start_header_id|>"], v["system"], v["<|end_header_id|>"]]
  assert tok.encode("hello world") == [v["<|begin_of_text|>"], v["hello"], v["world"]]
  assert sorted(tok.stop_ids(chat=True)) == sorted([v["<|eot_id|>"], v["<|end_of_text|>"]])
  assert tok.stop_ids(chat=False) == []
  assert tok.decode(ids) == "user hello world assistant"


def test_chatml_template(tmp_path):
  tok = Tokenizer(write_word_tokenizer(tmp_path, CHATML))
  assert tok.chat_format == "chatml"
  v = tok.vocab
  assert tok.encode("the cat", chat=True) == [v["<|im_start|>"], v["user"], v["the"], v["cat"],
                                              v["<|im_end|>"], v["<|im_start|>"], v["assistant"]]
  assert sorted(tok.stop_ids(True)) == sorted([v["<|im_end|>"], v["<|endoftext|>"]])


def test_chat_without_template_tokens_is_an_error(tmp_path):
  tok = Tokenizer(write_word_tokenizer(tmp_path, []))
  assert tok.chat_format is None and tok.stop_ids(True) == []
  with pytest.raises(TokenizerError, match="neither Llama-3 header tokens nor ChatML"):
    tok.encode("hello", chat=True)


def test_missing_or_broken_tokenizer(tmp_path):
  with pytest.raises(TokenizerError, match="No tokenizer at"):
    Tokenizer(str(tmp_path / "nope.json"))
  with pytest.raises(TokenizerError, match="No tokenizer at"):
    Tokenizer(str(tmp_path))                       # a directory without tokenizer.json
  bad = tmp_path / "tokenizer.json"
  bad.write_text("{not json")
  with pytest.raises(TokenizerError, match="not a valid tokenizer.json"):
    Tokenizer(str(bad))


def test_text_stream_holds_back_partial_utf8(tmp_path):
  tok = Tokenizer(write_byte_tokenizer(tmp_path))
  text = "hé ✓!"
  ids = tok.encode(text)
  assert len(ids) == len(text.encode("utf-8"))
  stream, pieces = TextStream(tok), []
  for n in range(1, len(ids) + 1):
    pieces.append(stream.update(ids[:n], final=n == len(ids)))
  assert "".join(pieces) == text
  assert all("\ufffd" not in p for p in pieces)
  assert pieces[1] == ""                            # the first byte of "é" alone prints nothing
