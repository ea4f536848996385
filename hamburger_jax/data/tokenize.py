"""Text pairs -> token ids with a `tokenizers` tokenizer.json and a chat template.

Templates (`template="auto"` picks the first whose special tokens are all in the vocabulary):

  llama3   [<|begin_of_text|>] then per turn `<|start_header_id|>ROLE<|end_header_id|>\\n\\nTEXT
           <|eot_id|>`, then `<|start_header_id|>assistant<|end_header_id|>\\n\\n`;
           response = TEXT <|eot_id|>.
  chatml   per turn `<|im_start|>ROLE\\nTEXT<|im_end|>\\n`, then `<|im_start|>assistant\\n`;
           response = TEXT <|im_end|>.
  plain    (no chat tokens) [BOS] `System: S\\n` `User: TEXT\\n` .. `Assistant:`;
           response = ` TEXT` [EOS].
  lm       plain language modelling: prompt = [BOS] (+ `lm_prefix`), response = TEXT [EOS].

Special tokens are inserted by id, never parsed out of the text, so user text cannot forge them.
The prompt and the response are encoded separately (as at inference, where generation starts
right after the prompt). Over-long examples are truncated (response tail cut), dropped, or in lm
mode split into several examples; every such case is counted.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from hamburger_jax.data.sources import DataError, RawExample
from hamburger_jax.text import chat
from hamburger_jax.text.chat import TEMPLATE_TOKENS as _TEMPLATE_TOKENS
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>")
_EOS_NAMES = ("<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>")
TEMPLATES = ("auto", "llama3", "chatml", "plain")


class TokenizedExample(NamedTuple):
  prompt: np.ndarray     # int32 [T], T >= 1
  response: np.ndarray   # int32 [R], R >= 1
  origin: str


@dataclasses.dataclass(frozen=True)
class TokenizeConfig:
  """How text becomes ids, and what happens to examples longer than `max_length` tokens."""
  tokenizer_path: str
  template: str = "auto"           # auto | llama3 | chatml | plain (sft mode)
  mode: str = "sft"                # sft | lm
  system_prompt: str | None = None  # used when a record brings no system message
  max_length: int = 2048           # prompt + response tokens
  overlong: str = "truncate"       # truncate | drop | split (lm mode only)
  bos_token: str | None = None     # None: found among common names
  eos_token: str | None = None     # None: the template's end token, else a common name
  lm_prefix: str = ""              # lm mode: text after BOS in every prompt

  def __post_init__(self):
    if self.template not in TEMPLATES:
      raise ValueError(f"Unknown template {self.template!r}; choose one of {TEMPLATES}.")
    if self.mode not in ("sft", "lm"):
      raise ValueError(f"mode must be 'sft' or 'lm', got {self.mode!r}.")
    if self.overlong not in ("truncate", "drop", "split"):
      raise ValueError(f"overlong must be truncate, drop or split, got {self.overlong!r}.")
    if self.overlong == "split" and self.mode != "lm":
      raise ValueError("overlong='split' only applies to lm mode; use truncate or drop.")
    if self.max_length < 2:
      raise ValueError(f"max_length must be at least 2, got {self.max_length}.")


class ChatTokenizer:
  """A tokenizer.json plus the prompt/response format of `TokenizeConfig`."""

  def __init__(self, cfg: TokenizeConfig):
    import tokenizers  # pylint: disable=g-import-not-at-top
    try:
      self.tok = tokenizers.Tokenizer.from_file(cfg.tokenizer_path)
    except Exception as e:  # pylint: disable=broad-except
      raise DataError(f"Cannot load tokenizer {cfg.tokenizer_path!r} ({e}): pass a "
                      "`tokenizers` tokenizer.json file.") from e
    self.tok.encode_special_tokens = True   # special tokens in text stay text
    self.cfg = cfg
    self.template = self._resolve_template(cfg.template) if cfg.mode == "sft" else "lm"
    self.bos_id = self._find(cfg.bos_token, _BOS_NAMES, "bos_token")
    end_name = chat.END_OF_TURN.get(self.template)
    self.eos_id = (self._id(end_name) if end_name and cfg.eos_token is None
                   else self._find(cfg.eos_token, _EOS_NAMES, "eos_token"))
    if self.template == "lm" and self.bos_id is None:
      raise DataError("lm mode needs a BOS token to start every prompt, and the tokenizer has "
                      f"none of {_BOS_NAMES}: set bos_token to one of its special tokens.")

  @property
  def vocab_size(self) -> int:
    return self.tok.get_vocab_size(with_added_tokens=True)

  def _id(self, name: str) -> int | None:
    return self.tok.token_to_id(name)

  def _find(self, name: str | None, candidates: Sequence[str], flag: str) -> int | None:
    if name is not None:
      i = self._id(name)
      if i is None:
        raise DataError(f"{flag} {name!r} is not in the tokenizer vocabulary.")
      return i
    return next((self._id(c) for c in candidates if self._id(c) is not None), None)

  def _resolve_template(self, template: str) -> str:
    if template == "auto":
      for name, tokens in _TEMPLATE_TOKENS.items():
        if all(self._id(t) is not None for t in tokens):
          return name
      return "plain"
    missing = [t for t in _TEMPLATE_TOKENS.get(template, ()) if self._id(t) is None]
    if missing:
      raise DataError(f"template {template!r} needs the special tokens {missing}, which the "
                      "tokenizer lacks: use template='auto' or 'plain'.")
    return template

  def encode_text(self, text: str) -> list[int]:
    return self.tok.encode(text, add_special_tokens=False).ids

  def encode_prompt(self, prompt: str | Sequence[dict[str, str]] | None,
                    system: str | None = None) -> list[int]:
    """The prompt ids, ending where the response starts."""
    system = system if system is not None else self.cfg.system_prompt
    bos = None if self.bos_id is None else self.tok.id_to_token(self.bos_id)
    if self.template == "lm":
      parts = ([chat.Special(bos)] if bos else []) + ([self.cfg.lm_prefix] if self.cfg.lm_prefix
                                                      else [])
    else:
      try:
        parts = chat.chat_parts(self.template, prompt if prompt is not None else "", system, bos)
      except ValueError as e:
        raise DataError(str(e)) from e
    return chat.encode_parts(parts, self.encode_text, self._id)

  def encode_response(self, response: str) -> list[int]:
    """The response ids (text, then the end token when there is one); [] for empty text."""
    if not response.strip():
      return []
    text = " " + response if self.template == "plain" else response
    ids = self.encode_text(text)
    return ids + ([self.eos_id] if ids and self.eos_id is not None else [])

  def decode(self, ids: Sequence[int]) -> str:
    return self.tok.decode(list(ids), skip_special_tokens=False)


def fit_length(prompt: Sequence[int], response: Sequence[int], cfg: TokenizeConfig,
               counters: collections.Counter) -> list[tuple[list[int], list[int]]]:
  """Applies the over-long rule: [] (dropped), one pair, or (split) several pairs."""
  prompt, response = list(prompt), list(response)
  if not response:
    counters["skipped_empty_response"] += 1
    return []
  room = cfg.max_length - len(prompt)
  if room < 1:
    counters["skipped_prompt_too_long"] += 1
    return []
  if len(response) <= room:
    return [(prompt, response)]
  if cfg.overlong == "drop":
    counters["skipped_overlong"] += 1
    return []
  if cfg.overlong == "split":
    counters["split_overlong"] += 1
    return [(prompt, response[i:i + room]) for i in range(0, len(response), room)]
  counters["truncated"] += 1
  return [(prompt, response[:room])]


def _encode(raw: RawExample, tokenizer: ChatTokenizer) -> tuple[list[int], list[int]]:
  """(prompt ids, response ids) of one example; DataError naming the record if it fails."""
  try:
    prompt = tokenizer.encode_prompt(raw.prompt, raw.system)
    response = tokenizer.encode_response(raw.response)
  except DataError as e:
    raise DataError(f"{raw.origin}: {e}") from e
  except Exception as e:  # pylint: disable=broad-except  # e.g. TypeError on unencodable text
    raise DataError(f"{raw.origin}: the record cannot be tokenized ({type(e).__name__}: "
                    f"{str(e)[:200]}). Fix it or set on_error='skip'.") from e
  if not prompt:
    raise DataError(f"{raw.origin}: the prompt has no tokens and the tokenizer has no BOS: set "
                    "bos_token, or give every record a prompt.")
  return prompt, response


def tokenize_examples(raws: Iterable[RawExample], tokenizer: ChatTokenizer,
                      counters: collections.Counter | None = None,
                      on_error: str = "raise") -> Iterator[TokenizedExample]:
  """RawExamples -> TokenizedExamples; empty responses and over-long cases are counted. A record
  that fails to tokenize raises DataError naming it, or with on_error="skip" is counted in
  counters["skipped_tokenize_error"]."""
  counters = collections.Counter() if counters is None else counters
  for raw in raws:
    try:
      prompt, response = _encode(raw, tokenizer)
    except DataError:
      if on_error != "skip":
        raise
      counters["skipped_tokenize_error"] += 1
      continue
    for p, r in fit_length(prompt, response, tokenizer.cfg, counters):
      counters["tokenized"] += 1
      yield TokenizedExample(np.asarray(p, np.int32), np.asarray(r, np.int32), raw.origin)
