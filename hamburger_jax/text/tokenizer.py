"""A thin wrapper around a `tokenizers` tokenizer.json: encode (optionally as a chat turn), decode,
stream text out of growing token lists, and the extra stop ids of chat models.

Chat templates (text/chat.py) are detected from the vocabulary: Llama-3 header tokens
(`<|start_header_id|>`, `<|end_header_id|>`, `<|eot_id|>`) or ChatML (`<|im_start|>`, `<|im_end|>`).
"""

from __future__ import annotations

import os
from typing import Sequence

from hamburger_jax.text import chat as templates


class TokenizerError(ValueError):
  """The tokenizer file is missing or unreadable, or cannot do what was asked."""


class Tokenizer:
  """tokenizer.json (a file, or a directory holding one) -> encode / decode."""

  def __init__(self, path: str):
    import tokenizers  # imported here so that token-id decoding never needs it
    if os.path.isdir(path):
      path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
      raise TokenizerError(f"No tokenizer at {path}: pass --tokenizer PATH/tokenizer.json "
                           "(or --token_ids to give prompts as ids).")
    try:
      self._tok = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
      raise TokenizerError(f"{path} is not a valid tokenizer.json ({e}).") from e
    self.path = path
    self.vocab = self._tok.get_vocab(with_added_tokens=True)

  @property
  def vocab_size(self) -> int:
    return max(self.vocab.values()) + 1

  @property
  def chat_format(self) -> str | None:
    """"llama3", "chatml" or None, from the special tokens in the vocabulary."""
    return templates.detect_format(self.vocab)

  def stop_ids(self, chat: bool) -> list[int]:
    """End-of-turn ids to stop on in chat mode (none otherwise)."""
    if not chat or self.chat_format is None:
      return []
    return [self.vocab[t] for t in templates.STOP_TOKENS[self.chat_format] if t in self.vocab]

  def fence_ids(self) -> list[int]:
    """Ids of the tokens whose text holds a Markdown code fence (```), sorted."""
    return sorted(i for i in self.vocab.values() if "```" in self._tok.decode([i]))

  def chat_parts(self, prompt: str | templates.Messages, system: str | None = None) -> list[str]:
    """The model's chat template around the conversation, ending where the assistant speaks."""
    fmt = self.chat_format
    if fmt is None:
      raise TokenizerError(f"{self.path} has neither Llama-3 header tokens nor ChatML tokens: "
                           "drop --chat to use the prompt as plain text.")
    bos = "<|begin_of_text|>" if fmt == "llama3" and "<|begin_of_text|>" in self.vocab else None
    try:
      return templates.chat_parts(fmt, prompt, system=system, bos=bos)
    except ValueError as e:
      raise TokenizerError(str(e)) from e

  def chat_prompt(self, prompt: str | templates.Messages, system: str | None = None) -> str:
    """The chat template as text (special tokens written out)."""
    return templates.render_text(self.chat_parts(prompt, system))

  def encode(self, prompt: str | templates.Messages, chat: bool = False,
             system: str | None = None, add_special_tokens: bool = True) -> list[int]:
    """Text -> ids. Plain text gets the tokenizer's own special tokens (e.g. BOS) unless
    add_special_tokens is False; a chat prompt (a str or a list of {"role", "content"} messages)
    carries them in its template, inserted by id: special-token strings inside message text stay
    text."""
    if not chat:
      return _ids(self._tok, prompt, add_special_tokens)
    return _chat_ids(self._tok, self.chat_parts(prompt, system))

  def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
    return self._tok.decode(list(ids), skip_special_tokens=skip_special)


class TextStream:
  """Turns a growing token list into newly printable text (holds back partial UTF-8 bytes)."""

  def __init__(self, tokenizer: Tokenizer):
    self.tokenizer = tokenizer
    self.printed = 0

  def update(self, ids: Sequence[int], final: bool = False) -> str:
    text = self.tokenizer.decode(ids)
    if not final:
      while text.endswith("\ufffd"):
        text = text[:-1]
    new = text[self.printed:]
    self.printed = max(self.printed, len(text))
    return new


def _ids(tok, text: str, add_special_tokens: bool) -> list[int]:
  """`tok.encode(text).ids` through encode_batch, which lets go of the GIL while it encodes (a
  server's event loop goes on meanwhile); the same ids."""
  return tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids


def _chat_ids(tok, parts: Sequence[str]) -> list[int]:
  """Template parts -> ids with `tok` (a tokenizers.Tokenizer); text runs never parse specials."""
  previous = tok.encode_special_tokens
  tok.encode_special_tokens = True
  try:
    return templates.encode_parts(parts, lambda t: _ids(tok, t, False), tok.token_to_id)
  finally:
    tok.encode_special_tokens = previous
