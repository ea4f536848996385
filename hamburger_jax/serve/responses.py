"""OpenAI response bodies: whole completions, streamed chunks (server-sent events), errors.

    fmt = Formatter(chat=True, model="hamburger-smollm2")
    fmt.full([fmt.choice(text, token_ids, "stop")], usage)     # a chat.completion object
    sse(fmt.chunk("Hel", [17], None, first=True))  # b'data: {...chat.completion.chunk...}\\n\\n'
    usage(prompt_tokens, tokens, macro_steps, verified)   # OpenAI usage + HAMburger's statistics

Each choice also carries `token_ids` (the generated ids of that response or chunk): an extension
that clients which do not know it ignore.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Sequence

DONE = b"data: [DONE]\n\n"


def sse(obj: dict) -> bytes:
  """One server-sent event carrying `obj` as JSON."""
  return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def usage(prompt_tokens: int, tokens: int, macro_steps: int, verified: bool = False) -> dict:
  """OpenAI usage plus HAMburger's statistics. kv_entries: KV slots the request filled (its
  prompt, then one per macro step but the last); kv_entries_base: the same for one token a step.
  verified: verified decoding served it (macro_steps are then the base's forwards, and every
  token fills its own slot, as the base's); adds "mode": "verify" and tokens_per_forward."""
  base = prompt_tokens + max(tokens - 1, 0)
  ham = {"macro_steps": macro_steps,
         "tokens_per_macro_step": round(tokens / max(macro_steps, 1), 4),
         "kv_entries": base if verified else prompt_tokens + max(macro_steps - 1, 0),
         "kv_entries_base": base}
  if verified:
    ham.update(mode="verify", tokens_per_forward=ham["tokens_per_macro_step"])
  return {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
          "total_tokens": prompt_tokens + tokens, "hamburger": ham}


def merged_usage(usages: Sequence[dict]) -> dict:
  """The usage of a request of several prompts: every count summed."""
  total = {k: sum(u[k] for u in usages) for k in ("prompt_tokens", "completion_tokens",
                                                  "total_tokens")}
  ham = {k: sum(u["hamburger"][k] for u in usages)
         for k in ("macro_steps", "kv_entries", "kv_entries_base")}
  ham["tokens_per_macro_step"] = round(total["completion_tokens"] / max(ham["macro_steps"], 1), 4)
  if "mode" in usages[0]["hamburger"]:       # one mode serves all prompts of a request
    ham.update(mode=usages[0]["hamburger"]["mode"], tokens_per_forward=ham["tokens_per_macro_step"])
  return dict(total, hamburger=ham)


class Formatter:
  """Bodies of one response (chat or text completion), with one id and creation time."""

  def __init__(self, chat: bool, model: str):
    self.chat, self.model = chat, model
    self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    self.created = int(time.time())

  def _envelope(self, obj: str, choices: list, usage: dict | None = None) -> dict:
    body = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
            "choices": choices}
    if usage is not None:
      body["usage"] = usage
    return body

  def choice(self, text: str, token_ids: list[int], finish_reason: str,
             logprobs: dict | None = None, index: int = 0) -> dict:
    """One choice of a non-streamed response (`logprobs`: `chat_logprobs` /
    `completion_logprobs`)."""
    choice = {"index": index, "finish_reason": finish_reason, "token_ids": token_ids,
              "logprobs": logprobs}
    if self.chat:
      choice["message"] = {"role": "assistant", "content": text}
    else:
      choice["text"] = text
    return choice

  def full(self, choices: list[dict], usage: dict) -> dict:
    """The non-streamed response."""
    return self._envelope("chat.completion" if self.chat else "text_completion", choices, usage)

  def chunk(self, text: str, token_ids: list[int], finish_reason: str | None,
            first: bool = False) -> dict:
    """One streamed chunk (the chat role is sent with the first)."""
    choice = {"index": 0, "finish_reason": finish_reason, "token_ids": token_ids}
    if self.chat:
      choice["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
      return self._envelope("chat.completion.chunk", [choice])
    choice.update(text=text, logprobs=None)
    return self._envelope("text_completion", [choice])

  def usage_chunk(self, usage: dict) -> dict:
    """The last chunk with stream_options.include_usage: no choices, the usage."""
    return self._envelope("chat.completion.chunk" if self.chat else "text_completion", [], usage)


def completion_logprobs(tokens: list[str], token_logprobs: list, top_logprobs: list | None,
                        text_offset: list[int]) -> dict:
  """A text completion's `logprobs`: per token its text, its log-prob (None for a prompt's first
  token, which has no predictor), the most likely tokens there ({text: log-prob}, None at the
  first prompt token; the list is None when none were asked) and its character offset."""
  return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
          "text_offset": text_offset}


def chat_logprobs(tokens: list[str], token_logprobs: list[float], top_logprobs: list[dict]) -> dict:
  """A chat completion's `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}]} per
  generated token (top_logprobs: [{token, logprob, bytes}], most likely first; bytes: the UTF-8
  of the token's text)."""
  entry = lambda t, lp: {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}
  return {"content": [dict(entry(t, lp), top_logprobs=[entry(u, v) for u, v in top.items()])
                      for t, lp, top in zip(tokens, token_logprobs, top_logprobs)]}
