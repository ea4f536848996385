"""OpenAI request bodies -> validated generation settings; errors as OpenAI error objects.

    body = parse_body(raw_bytes)                          # ApiError(400): invalid JSON, too deep
    check_model(body, "hamburger-smollm2")                # ApiError(404) for another model
    settings = parse_settings(body, limits)               # ApiError(400) naming the field
    messages = chat_messages(body)                        # /v1/chat/completions
    prompts = completion_prompts(body)                    # /v1/completions: text or ids, or a batch
    check_text(text, "prompt")                            # ApiError(400) for a lone surrogate

Extensions beside OpenAI's fields: `top_k` (0 = off), `confidence` (HAMburger's stop-head
threshold in (0, 1]: a macro step's group goes on while 1 - p_stop >= it) and `min_token_prob`
(in [0, 1]: a drafted token joins its group only if its probability is >= it; 0 = off) and
`verify` (true: verified decoding, the base checks the drafts and the answer is the base's own;
false: merged decoding; absent: the server's mode; `Modes` says which the server runs).

Log-probs, not streamed: /v1/completions takes `echo` (the prompt before the completion) and
`logprobs` N in 0..MAX_LOGPROBS (each token's log-prob and the N most likely tokens at each
position); /v1/chat/completions takes `logprobs` true with `top_logprobs` N in
0..MAX_TOP_LOGPROBS. The N most likely tokens are known for the prompt and the first generated
token only (later tokens come from merged context and micro steps, whose full distributions the
decode loop does not keep), so N >= 1 needs max_tokens 1, as lm-eval's log-likelihood requests
send.
"""

from __future__ import annotations

import dataclasses
import json
import math
import reprlib
import secrets
from typing import Any

from hamburger_jax.decode.verify import DEFAULT_KNOBS as VERIFY_KNOBS

MAX_STOP_STRINGS = 4
MAX_LOGPROBS = 5                  # OpenAI's limit for /v1/completions
MAX_TOP_LOGPROBS = 20             # OpenAI's limit for /v1/chat/completions
MAX_PROMPTS = 64                  # prompts in one /v1/completions request (a batch)
SEED_LIMIT = 2**31
MAX_JSON_DEPTH = 32               # nesting of a request body (OpenAI's bodies need 5)


class ApiError(Exception):
  """An HTTP error with an OpenAI-style body: {"error": {"message", "type", "param", "code"}}."""

  def __init__(self, status: int, message: str, param: str | None = None,
               kind: str = "invalid_request_error", code: str | None = None,
               headers: dict[str, str] | None = None):
    super().__init__(message)
    self.status, self.message, self.param = status, message, param
    self.kind, self.code, self.headers = kind, code, headers or {}

  def body(self) -> dict:
    return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                      "code": self.code}}


@dataclasses.dataclass(frozen=True)
class Modes:
  """The decoding modes a server runs, chosen per request by `verify`: merged decoding (False)
  and verified decoding (True)."""
  default: bool = False             # the mode of requests that give none (--verify)
  both: bool = False                # both modes run (--verify_requests)
  base: bool = False                # the base decodes alone (--base): nothing to verify

  def default_name(self) -> str:
    """The default mode's name: "base", "merged" or "verify"."""
    return "base" if self.base else "verify" if self.default else "merged"

  def names(self) -> list[str]:
    """The modes served, as /health lists them."""
    return ["merged", "verify"] if self.both else [self.default_name()]

  def resolve(self, verify: bool | None) -> bool:
    """The mode of a request (`verify` None: the default); ApiError 400 when not run here."""
    if verify is None or self.both or verify == self.default:
      return self.default if verify is None else verify
    if self.base:
      raise ApiError(400, "'verify': true checks HAMburger's drafts, and this server decodes with "
                          "the base model alone (--base): drop 'verify' or start the server "
                          "without --base.", "verify")
    running = "verified decoding only" if self.default else "merged decoding only"
    raise ApiError(400, f"'verify': {str(verify).lower()} asks for a mode this server does not "
                        f"run ({running}): start the server with --verify_requests to serve "
                        "both, or drop 'verify'.", "verify")


@dataclasses.dataclass(frozen=True)
class Limits:
  """Server-side bounds of a request."""
  max_tokens: int                   # largest max_tokens accepted
  default_max_tokens: int           # used when a request gives none
  default_temperature: float = 1.0  # OpenAI's default
  default_confidence: float = 0.8   # merged decoding's knobs when a request gives none
  default_min_token_prob: float = 0.0
  verify_confidence: float = VERIFY_KNOBS["confidence"]     # verified decoding's
  verify_min_token_prob: float = VERIFY_KNOBS["min_token_prob"]
  modes: Modes = Modes()


@dataclasses.dataclass
class Settings:
  """Validated knobs of one request."""
  max_tokens: int
  temperature: float
  top_p: float
  top_k: int
  seed: int
  confidence: float
  min_token_prob: float
  stop: list[str]
  stream: bool
  include_usage: bool
  echo: bool = False                # /v1/completions: the prompt before the completion
  logprobs: int | None = None       # most likely tokens listed per position (None: no log-probs)
  verify: bool = False              # verified decoding (False: merged, or the base alone)


_BRIEF = reprlib.Repr()
_BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlist, _BRIEF.maxdict, _BRIEF.maxlevel = 80, 80, 8, 4, 3


def brief(value: Any) -> str:
  """A short repr of a client's value for an error message (long strings and lists cut, nesting
  bounded, lone surrogates escaped)."""
  return _BRIEF.repr(value)


def _too_deep(body: Any, limit: int) -> bool:
  """Whether `body` nests containers deeper than `limit` (iterative: any depth is safe)."""
  stack = [(body, 1)]
  while stack:
    node, depth = stack.pop()
    if depth > limit:
      return True
    for child in (node.values() if isinstance(node, dict) else node):
      if isinstance(child, (dict, list)):
        stack.append((child, depth + 1))
  return False


def parse_body(raw: bytes) -> dict:
  """The request's JSON object; ApiError 400 for invalid JSON or UTF-8, or containers nested
  deeper than MAX_JSON_DEPTH."""
  deep = ApiError(400, f"The request body nests JSON arrays/objects deeper than "
                       f"{MAX_JSON_DEPTH} levels.")
  try:
    body = json.loads(raw)
  except RecursionError as e:
    raise deep from e
  except (ValueError, UnicodeDecodeError) as e:
    raise ApiError(400, f"The request body is not valid JSON ({e}).") from e
  if not isinstance(body, dict):
    raise ApiError(400, f"The request body must be a JSON object, got {type(body).__name__}.")
  if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _too_deep(body, MAX_JSON_DEPTH):
    raise deep
  return body


def check_text(text: str, param: str) -> str:
  """`text` unless it holds a lone surrogate (JSON's "\\ud800": valid JSON, not Unicode text)."""
  if not text.isascii():
    try:
      text.encode("utf-8")
    except UnicodeEncodeError as e:
      raise ApiError(400, f"'{param}' holds {text[e.start]!r} at character {e.start}, a lone "
                          "surrogate: send valid Unicode text.", param) from e
  return text


def check_model(body: dict, model_id: str) -> None:
  model = body.get("model")
  if model is None:
    raise ApiError(400, f"'model' is required: this server serves {model_id!r}.", "model")
  if model != model_id:
    raise ApiError(404, f"The model {brief(model)} does not exist: this server serves "
                        f"{model_id!r}.", "model", code="model_not_found")


def _number(body: dict, name: str, default, lo: float, hi: float, *, integer: bool = False,
            lo_open: bool = False, what: str = ""):
  """body[name] (default when absent or null) checked to be a finite number in [lo, hi]."""
  value = body.get(name)
  if value is None:
    return default
  kinds = (int,) if integer else (int, float)
  if isinstance(value, bool) or not isinstance(value, kinds):
    raise ApiError(400, f"'{name}' must be {'an integer' if integer else 'a number'}, got "
                        f"{brief(value)}.", name)
  low = "(" if lo_open else "["
  if not (math.isfinite(value) and (value > lo if lo_open else value >= lo) and value <= hi):
    raise ApiError(400, f"'{name}' must be in {low}{lo}, {hi}]{what}, got {brief(value)}.", name)
  return int(value) if integer else float(value)


_NEUTRAL = {"n": (1,), "best_of": (1,), "echo": (False,), "logprobs": (False, 0),
            "top_logprobs": (0,), "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
            "logit_bias": ({},), "suffix": ("",), "tools": ([],), "functions": ([],)}


_IMPLEMENTED = {False: ("echo", "logprobs"), True: ("logprobs", "top_logprobs")}   # by chat


def _unsupported(body: dict, chat: bool) -> None:
  """OpenAI fields this server does not implement: accepted only absent or at a neutral value."""
  for name, neutral in _NEUTRAL.items():
    if name in _IMPLEMENTED[chat]:
      continue
    value = body.get(name)
    if value is not None and not any(type(value) is type(a) and value == a for a in neutral):
      raise ApiError(400, f"'{name}' = {brief(value)} is not supported by this server (allowed: "
                          f"{list(neutral)} or absent).", name)
  fmt = body.get("response_format")
  if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
    raise ApiError(400, "'response_format' other than {\"type\": \"text\"} is not supported.",
                   "response_format")


def _stop_strings(body: dict) -> list[str]:
  stop = body.get("stop")
  if stop is None:
    return []
  stops = [stop] if isinstance(stop, str) else stop
  if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
    raise ApiError(400, f"'stop' must be a non-empty string or a list of them, got {brief(stop)}.",
                   "stop")
  if len(stops) > MAX_STOP_STRINGS:
    raise ApiError(400, f"'stop' holds at most {MAX_STOP_STRINGS} strings, got {len(stops)}.",
                   "stop")
  return [check_text(s, "stop") for s in stops]


def _flag(body: dict, name: str) -> bool:
  value = body.get(name, False)
  if value is None:
    return False
  if not isinstance(value, bool):
    raise ApiError(400, f"'{name}' must be true or false, got {brief(value)}.", name)
  return value


def _log_probs(body: dict, chat: bool, max_tokens: int, stream: bool) -> tuple[bool, int | None]:
  """(echo, most likely tokens per position or None) of a request, checked."""
  if chat:
    echo, name = False, "top_logprobs"
    top = _number(body, name, 0, 0, MAX_TOP_LOGPROBS, integer=True)
    if not _flag(body, "logprobs"):
      if top:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true.", name)
      top = None
  else:
    echo, name = _flag(body, "echo"), "logprobs"
    top = (None if body.get(name) is False             # false: off, as chat clients write it
           else _number(body, name, None, 0, MAX_LOGPROBS, integer=True))
  if stream and (echo or top is not None):
    raise ApiError(400, "'echo' and 'logprobs' are not supported with 'stream': drop 'stream'.",
                   "stream")
  if top and max_tokens > 1:
    raise ApiError(400, f"'{name}' = {top} needs 'max_tokens' 1: the most likely tokens are known "
                        f"for the prompt and the first generated token only ('{name}' 0 gives "
                        "every generated token's own log-prob).", name)
  return echo, top


def parse_settings(body: dict, limits: Limits, chat: bool = True) -> Settings:
  """The knobs of either endpoint, each checked (ApiError 400 naming the field)."""
  _unsupported(body, chat)
  name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
  max_tokens = _number(body, name, limits.default_max_tokens, 1, limits.max_tokens, integer=True,
                       what=" (the server's limit)")
  options = body.get("stream_options") or {}
  if not isinstance(options, dict):
    raise ApiError(400, f"'stream_options' must be an object, got {brief(options)}.",
                   "stream_options")
  seed = body.get("seed")
  stream = _flag(body, "stream")
  echo, logprobs = _log_probs(body, chat, max_tokens, stream)
  verify = body.get("verify")
  if verify is not None and not isinstance(verify, bool):
    raise ApiError(400, f"'verify' must be true or false, got {brief(verify)}.", "verify")
  verify = limits.modes.resolve(verify)
  confidence, min_token_prob = ((limits.verify_confidence, limits.verify_min_token_prob) if verify
                                else (limits.default_confidence, limits.default_min_token_prob))
  return Settings(
      max_tokens=max_tokens,
      temperature=_number(body, "temperature", limits.default_temperature, 0.0, 2.0),
      top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
      top_k=_number(body, "top_k", 0, 0, 2**31 - 1, integer=True),
      seed=(secrets.randbelow(SEED_LIMIT) if seed is None
            else _number(body, "seed", 0, 0, SEED_LIMIT - 1, integer=True)),
      confidence=_number(body, "confidence", confidence, 0.0, 1.0, lo_open=True),
      min_token_prob=_number(body, "min_token_prob", min_token_prob, 0.0, 1.0),
      stop=_stop_strings(body), stream=stream,
      include_usage=_flag(options, "include_usage"), echo=echo, logprobs=logprobs, verify=verify)


def _content_text(content: Any, index: int) -> str:
  """A message's content: a string, or a list of {"type": "text", "text": ...} parts."""
  param = f"messages[{index}].content"
  if isinstance(content, str):
    return check_text(content, param)
  if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in content):
    return check_text("".join(p["text"] for p in content), param)
  raise ApiError(400, f"messages[{index}].content must be a string or a list of text parts "
                      "(other content types are not supported).", f"messages[{index}].content")


ROLES = ("system", "developer", "user", "assistant")


def chat_messages(body: dict) -> list[dict[str, str]]:
  """body["messages"] -> [{"role", "content"}] ("developer" is read as "system")."""
  messages = body.get("messages")
  if not isinstance(messages, list) or not messages:
    raise ApiError(400, "'messages' must be a non-empty list of {\"role\", \"content\"} objects.",
                   "messages")
  out = []
  for i, m in enumerate(messages):
    if not isinstance(m, dict) or m.get("role") not in ROLES:
      raise ApiError(400, f"messages[{i}] must be an object whose 'role' is one of {ROLES}.",
                     f"messages[{i}].role")
    role = "system" if m["role"] == "developer" else m["role"]
    out.append({"role": role, "content": _content_text(m.get("content"), i)})
  if out[-1]["role"] == "assistant":
    raise ApiError(400, "The last message must not be the assistant's (continuing an assistant "
                        "turn is not supported).", "messages")
  return out


def _one_prompt(prompt) -> bool:
  """A non-empty string or a non-empty list of token ids."""
  if isinstance(prompt, str):
    return bool(prompt)
  return (isinstance(prompt, list) and bool(prompt)
          and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt))


def completion_prompts(body: dict) -> list[str | list[int]]:
  """body["prompt"]: a string or a list of token ids, or a list of up to MAX_PROMPTS of them (a
  batch: one choice each, in order)."""
  prompt = body.get("prompt")
  if _one_prompt(prompt):
    return [check_text(prompt, "prompt") if isinstance(prompt, str) else prompt]
  if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
    if len(prompt) > MAX_PROMPTS:
      raise ApiError(400, f"'prompt' holds {len(prompt)} prompts; at most {MAX_PROMPTS} per "
                          "request.", "prompt")
    for i, p in enumerate(prompt):
      if not _one_prompt(p):
        raise ApiError(400, f"prompt[{i}] must be a non-empty string or a non-empty list of "
                            "token ids.", "prompt")
    return [check_text(p, "prompt") if isinstance(p, str) else p for p in prompt]
  raise ApiError(400, "'prompt' must be a non-empty string, a non-empty list of token ids, or a "
                      f"list of up to {MAX_PROMPTS} of them.", "prompt")
