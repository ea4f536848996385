"""The tokenizer stored in a GGUF file's metadata, rebuilt as a HF `tokenizers.Tokenizer`.

    tok, info = load_gguf_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = tok.encode(apply_chatml("What is the capital of France?")).ids
    info["chat_template"], info["bos_id"], info["eos_ids"]

Only `tokenizer.ggml.model == "gpt2"` (byte-level BPE, as used by SmolLM2 and Llama 3) is
supported. The pre-tokenizer follows `tokenizer.ggml.pre` the way llama.cpp does: GPT-2 regex
("gpt-2"), single digits split first ("smollm", "starcoder", ...), or the Llama-3 regex
("llama-bpe"). Control tokens (type 3) become special added tokens, user-defined ones (type 4)
plain added tokens, so "<|im_start|>" in text encodes to its single id.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from hamburger_jax.convert.errors import CheckpointError
from hamburger_jax.convert.gguf import gguf_field, gguf_special_ids, open_gguf
from hamburger_jax.text import chat
from hamburger_jax.text.chat import SMOLLM2_SYSTEM_PROMPT

# llama.cpp's token types (gguf.TokenType).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = range(
    1, 7)


_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2_PRE = ("default", "gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais")
_DIGITS_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
_LLAMA3_PRE = ("llama-bpe", "llama3", "llama-v3", "smaug-bpe")
SUPPORTED_PRE = _GPT2_PRE + _DIGITS_PRE + _LLAMA3_PRE


def _pre_tokenizer(pre: str, source: str):
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
  if pre in _GPT2_PRE:
    return byte_level
  if pre in _DIGITS_PRE:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
  if pre in _LLAMA3_PRE:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
  raise CheckpointError(f"{source}: tokenizer.ggml.pre = {pre!r} is not supported; known: "
                        f"{sorted(SUPPORTED_PRE)}.")


def tokenizer_from_gguf_reader(reader, source: str = "GGUF file") -> tuple[Tokenizer, dict]:
  """(Tokenizer, info) from an open GGUF reader (`convert.gguf.open_gguf`; see `load_gguf_tokenizer`)."""
  kind = gguf_field(reader, "tokenizer.ggml.model", source=source)
  if kind != "gpt2":
    raise CheckpointError(f"{source}: tokenizer.ggml.model = {kind!r}; only 'gpt2' (byte-level "
                          "BPE) tokenizers can be rebuilt.")
  tokens = gguf_field(reader, "tokenizer.ggml.tokens", source=source)
  merges = gguf_field(reader, "tokenizer.ggml.merges", source=source)
  types = gguf_field(reader, "tokenizer.ggml.token_type", [TOKEN_NORMAL] * len(tokens))
  if len(types) != len(tokens):
    raise CheckpointError(f"{source}: {len(tokens)} tokens but {len(types)} token types.")
  vocab: dict[str, int] = {}
  for i, tok in enumerate(tokens):
    vocab.setdefault(tok, i)
  pairs = []
  for m in merges:
    a, sep, b = m.partition(" ")
    if not sep or not a or not b:
      raise CheckpointError(f"{source}: malformed BPE merge {m!r}.")
    pairs.append((a, b))
  pre = gguf_field(reader, "tokenizer.ggml.pre", "default")
  bos, eos = gguf_special_ids(reader)
  unk = gguf_field(reader, "tokenizer.ggml.unknown_token_id", None)
  pad = gguf_field(reader, "tokenizer.ggml.padding_token_id", None)

  tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False,
                             ignore_merges=pre in _LLAMA3_PRE))
  tok.pre_tokenizer = _pre_tokenizer(pre, source)
  tok.decoder = decoders.ByteLevel()
  added = [AddedToken(tokens[i], special=types[i] == TOKEN_CONTROL, normalized=False)
           for i in range(len(tokens)) if types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]
  tok.add_tokens(added)  # special flags are kept: decode(skip_special_tokens=True) drops them
  add_bos = bool(gguf_field(reader, "tokenizer.ggml.add_bos_token", False))
  if add_bos and bos is not None:
    b = tokens[bos]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{b}:0 $A:0", pair=f"{b}:0 $A:0 {b}:1 $B:1", special_tokens=[(b, bos)])
  else:
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
  name = lambda i: None if i is None else tokens[int(i)]
  info = {
      "chat_template": gguf_field(reader, "tokenizer.chat_template", None),
      "bos_id": bos, "eos_ids": eos, "pad_id": None if pad is None else int(pad),
      "unk_id": None if unk is None else int(unk), "add_bos": add_bos, "pre": pre,
      "bos_token": name(bos), "eos_token": name(eos[0]) if eos else None, "pad_token": name(pad),
      "unk_token": name(unk), "special_ids": tuple(i for i, t in enumerate(types)
                                                   if t == TOKEN_CONTROL),
  }
  return tok, info


def load_gguf_tokenizer(path: str | os.PathLike,
                        save_dir: str | os.PathLike | None = None) -> tuple[Tokenizer, dict]:
  """GGUF file -> (tokenizers.Tokenizer, info).

  info: chat_template (str or None), bos_id, eos_ids (tuple), pad_id, unk_id, add_bos, pre,
  the token strings bos_token / eos_token / pad_token / unk_token, special_ids.
  With `save_dir`, also writes tokenizer.json + tokenizer_config.json there (`save_tokenizer`).
  """
  tok, info = tokenizer_from_gguf_reader(open_gguf(path), source=os.fspath(path))
  if save_dir is not None:
    save_tokenizer(tok, info, save_dir)
  return tok, info


def save_tokenizer(tok: Tokenizer, info: dict, directory: str | os.PathLike) -> str:
  """Writes tokenizer.json and a tokenizer_config.json (chat template, special tokens) that
  `transformers.AutoTokenizer.from_pretrained(directory)` reads. Returns tokenizer.json's path."""
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, "tokenizer.json")
  tok.save(path)
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
            "add_bos_token": info["add_bos"], "model_max_length": 1 << 30}
  for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
    if info.get(key) is not None:
      config[key] = info[key]
  if info.get("chat_template"):
    config["chat_template"] = info["chat_template"]
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump(config, f, indent=2, ensure_ascii=False)
  return path


def apply_chatml(messages_or_prompt: str | Sequence[dict[str, str]],
                 default_system: str | None = SMOLLM2_SYSTEM_PROMPT,
                 add_generation_prompt: bool = True) -> str:
  """Renders ChatML as SmolLM2-Instruct's chat template does (text/chat.py's "chatml" format).

  A str is one user message. When no message is a system message, one with `default_system` is
  put first (skip that with default_system=None).
  """
  return chat.render_text(chat.chat_parts("chatml", messages_or_prompt, system=default_system,
                                          generation_prompt=add_generation_prompt))


def render_chat_template(template: str, messages_or_prompt: str | Sequence[dict[str, str]],
                         add_generation_prompt: bool = True, **extra: Any) -> str:
  """Renders a GGUF/HF Jinja chat template (needs jinja2), like transformers does."""
  try:
    import jinja2  # noqa: PLC0415
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415
  except ImportError as e:
    raise ImportError("Rendering a Jinja chat template needs jinja2 (pip install jinja2); "
                      "apply_chatml renders ChatML without it.") from e

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
  env.globals["raise_exception"] = raise_exception
  return env.from_string(template).render(messages=chat.as_messages(messages_or_prompt),
                                          add_generation_prompt=add_generation_prompt, **extra)
