"""Chat templates: the one place a conversation becomes prompt text or prompt ids.

    parts = chat_parts("chatml", "Hi", system="Be brief.")   # [Special, str, Special, ...]
    render_text(parts)          # "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n..."
    encode_parts(parts, encode_text, token_id)                 # ids, specials inserted by id

Formats:
  llama3  [<|begin_of_text|>] per turn `<|start_header_id|>ROLE<|end_header_id|>\\n\\nTEXT<|eot_id|>`,
          then `<|start_header_id|>assistant<|end_header_id|>\\n\\n`
  chatml  per turn `<|im_start|>ROLE\\nTEXT<|im_end|>\\n`, then `<|im_start|>assistant\\n` (no BOS)
  plain   [BOS] `Role: TEXT\\n` per turn, then `Assistant:`

Special tokens are inserted by id and never parsed out of message text, so user text cannot forge
them. Data preparation (data/tokenize.py), distillation and decoding (text/tokenizer.py), GGUF
templates (text/gguf_tokenizer.py) and serving all render through `chat_parts`.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

TEMPLATE_TOKENS = {
    "llama3": ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    "chatml": ("<|im_start|>", "<|im_end|>"),
}
STOP_TOKENS = {"llama3": ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
               "chatml": ("<|im_end|>", "<|endoftext|>")}
END_OF_TURN = {"llama3": "<|eot_id|>", "chatml": "<|im_end|>"}
FORMATS = ("llama3", "chatml", "plain")
# The default system prompt SmolLM2-Instruct's chat template injects when none is given.
SMOLLM2_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

Messages = Sequence[Mapping[str, str]]


class Special(str):
  """The name of a special token: rendered as its text, encoded as its single id."""


def detect_format(vocab: Mapping[str, int]) -> str | None:
  """"llama3" or "chatml" when all of the format's special tokens are in `vocab`, else None."""
  for name, tokens in TEMPLATE_TOKENS.items():
    if all(t in vocab for t in tokens):
      return name
  return None


def as_messages(prompt: str | Messages, system: str | None = None) -> list[dict[str, str]]:
  """A str is one user turn; `system` is put first unless the messages hold a system turn."""
  if isinstance(prompt, str):
    turns = [{"role": "user", "content": prompt}]
  else:
    turns = [dict(m) for m in prompt]
    for m in turns:
      if not {"role", "content"} <= set(m) or not all(isinstance(m[k], str)
                                                      for k in ("role", "content")):
        raise ValueError(f"A chat message needs string 'role' and 'content' fields; got {m!r}.")
  if system is not None and not any(t["role"] == "system" for t in turns):
    turns = [{"role": "system", "content": system}] + turns
  return turns


def chat_parts(fmt: str, prompt: str | Messages, system: str | None = None, bos: str | None = None,
               generation_prompt: bool = True) -> list[str]:
  """The conversation as text pieces and `Special` names, ending where the assistant speaks.

  bos: name of the BOS token to start with (llama3 and plain; ChatML puts none).
  """
  turns = as_messages(prompt, system)
  if fmt == "llama3":
    sh, eh, eot = (Special(t) for t in TEMPLATE_TOKENS["llama3"])
    parts: list[str] = [Special(bos)] if bos else []
    for t in turns:
      parts += [sh, t["role"], eh, "\n\n" + t["content"], eot]
    return parts + ([sh, "assistant", eh, "\n\n"] if generation_prompt else [])
  if fmt == "chatml":
    start, end = (Special(t) for t in TEMPLATE_TOKENS["chatml"])
    parts = []
    for t in turns:
      parts += [start, f"{t['role']}\n{t['content']}", end, "\n"]
    return parts + ([start, "assistant\n"] if generation_prompt else [])
  if fmt == "plain":
    parts = [Special(bos)] if bos else []
    parts += [f"{t['role'].capitalize()}: {t['content']}\n" for t in turns]
    return parts + (["Assistant:"] if generation_prompt else [])
  raise ValueError(f"Unknown chat format {fmt!r}: use one of {FORMATS}.")


def render_text(parts: Sequence[str]) -> str:
  """The template as one string (special tokens written out)."""
  return "".join(parts)


def encode_parts(parts: Sequence[str], encode_text: Callable[[str], list[int]],
                 token_id: Callable[[str], int | None]) -> list[int]:
  """Ids: each `Special` by its id, each run of adjacent text encoded together.

  encode_text must not add special tokens and must keep special-token strings inside the text as
  text; token_id maps a special token's name to its id (None if absent: a ValueError).
  """
  ids: list[int] = []
  text: list[str] = []
  for p in list(parts) + [None]:
    if p is not None and not isinstance(p, Special):
      text.append(p)
      continue
    if text:
      ids.extend(encode_text("".join(text)))
      text = []
    if p is not None:
      i = token_id(p)
      if i is None:
        raise ValueError(f"The tokenizer has no special token {p!r} that the chat template needs.")
      ids.append(i)
  return ids
