"""A thin wrapper around a `tokenizers` tokenizer.json: encode (optionally as a chat turn), decode,
stream text out of growing token lists, and the extra stop ids of chat models.

Chat templates are detected from the vocabulary: Llama-3 header tokens (`<|start_header_id|>`,
`<|end_header_id|>`, `<|eot_id|>`) or ChatML (`<|im_start|>`, `<|im_end|>`).
"""

from __future__ import annotations

import os
from typing import Sequence

_LLAMA3 = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
_CHATML = ("<|im_start|>", "<|im_end|>")
_STOP_TOKENS = {"llama3": ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
                "chatml": ("<|im_end|>", "<|endoftext|>")}


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
    if all(t in self.vocab for t in _LLAMA3):
      return "llama3"
    if all(t in self.vocab for t in _CHATML):
      return "chatml"
    return None

  def stop_ids(self, chat: bool) -> list[int]:
    """End-of-turn ids to stop on in chat mode (none otherwise)."""
    if not chat or self.chat_format is None:
      return []
    return [self.vocab[t] for t in _STOP_TOKENS[self.chat_format] if t in self.vocab]

  def chat_prompt(self, text: str, system: str | None = None) -> str:
    """The model's chat template around one user turn, ending where the assistant speaks."""
    fmt = self.chat_format
    if fmt == "llama3":
      bos = "<|begin_of_text|>" if "<|begin_of_text|>" in self.vocab else ""
      turn = lambda role, body: f"<|start_header_id|>{role}<|end_header_id|>\n\n{body}<|eot_id|>"
      head = turn("system", system) if system else ""
      return f"{bos}{head}{turn('user', text)}<|start_header_id|>assistant<|end_header_id|>\n\n"
    if fmt == "chatml":
      head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
      return f"{head}<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    raise TokenizerError(f"{self.path} has neither Llama-3 header tokens nor ChatML tokens: "
                         "drop --chat to use the prompt as plain text.")

  def encode(self, text: str, chat: bool = False, system: str | None = None) -> list[int]:
    """Text -> ids. Plain text gets the tokenizer's own special tokens (e.g. BOS); a chat prompt
    carries them in its template."""
    if chat:
      return self._tok.encode(self.chat_prompt(text, system), add_special_tokens=False).ids
    return self._tok.encode(text, add_special_tokens=True).ids

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
