"""Typed validation of decode inputs: token-id prompts, prompt text, seeds and sampling knobs.

    ids = token_ids(prompt, index)      # a list of Python ints, or DecodeInputError
    text = utf8_text(line, "Prompt 0")  # str that encodes as UTF-8, or DecodeInputError
    check_seed(seed); check_temperature(t)
    lines = read_lines(open(path, "rb"), "--prompt_file x", max_bytes, max_prompts)
    ids = parse_token_ids("1,5,7", index)   # decode.py --token_ids; UsageError naming the element

A prompt is a sequence of integers (Python or numpy ints): a string such as "157" is refused (it
would otherwise read as the ids 1, 5, 7), and so are floats, bools and nested lists.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

MAX_SEED = 2**32 - 1            # jax keys hold 32 bits: larger seeds would repeat smaller ones
MAX_PROMPT_BYTES = 4 << 20      # default cap on prompt text read from a file or stdin
MAX_PROMPTS = 10_000            # default cap on prompt lines
MAX_ID_DIGITS = 12              # longer token ids lie outside any vocabulary


class DecodeInputError(ValueError):
  """Unusable decode input (empty prompt, unknown token id, too long, bad knob); says which."""


class UsageError(ValueError):
  """A bad command line or loader argument (the message says what to change)."""


def token_ids(prompt, index: int) -> list[int]:
  """Prompt `index` as a list of ints; DecodeInputError naming the first bad element."""
  if isinstance(prompt, (str, bytes)):
    raise DecodeInputError(f"Prompt {index} is a {type(prompt).__name__} ({prompt!r:.40}): give a "
                           "list of token ids (tokenize text first).")
  if isinstance(prompt, np.ndarray) and prompt.ndim != 1:
    raise DecodeInputError(f"Prompt {index} has shape {prompt.shape}: give a 1-D list of token ids.")
  try:
    items = list(prompt)
  except TypeError as e:
    raise DecodeInputError(f"Prompt {index} is a {type(prompt).__name__}, not a list of token "
                           "ids.") from e
  for j, t in enumerate(items):
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, numbers.Integral):
      raise DecodeInputError(f"Prompt {index} element {j} is {t!r} ({type(t).__name__}): token "
                             "ids must be integers.")
  return [int(t) for t in items]


def utf8_text(text: str, what: str) -> str:
  """`text` if it is valid Unicode (argv keeps undecodable bytes as surrogates); else an error."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    bad = text[e.start:e.end].encode("utf-8", "surrogateescape")
    raise DecodeInputError(f"{what} is not valid UTF-8 (byte {bad[:1].hex()} at character "
                           f"{e.start}): save the text as UTF-8.") from None
  return text


def check_seed(seed) -> int:
  if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed <= MAX_SEED:
    raise DecodeInputError(f"seed must be an integer in 0..{MAX_SEED}, got {seed!r}.")
  return int(seed)


def check_temperature(temperature) -> float:
  if (isinstance(temperature, bool) or not isinstance(temperature, numbers.Real)
      or not math.isfinite(temperature) or temperature < 0):
    raise DecodeInputError(f"temperature must be a finite number >= 0 (0 = greedy), got "
                           f"{temperature!r}.")
  return float(temperature)


# --- prompt lines (decode.py) --------------------------------------------------------------------

def read_lines(stream, what: str, max_bytes: int, max_prompts: int) -> list[str]:
  """The non-blank lines of a binary (or text) stream: UsageError naming the cap if it holds more
  than `max_bytes` bytes (at most max_bytes + 1 are read) or more than `max_prompts` lines, or
  naming the first byte that is not UTF-8."""
  raw = stream.read(max_bytes + 1)
  check_bytes(raw, what, max_bytes)
  text = _utf8(raw, what) if isinstance(raw, bytes) else utf8_text(raw, what)
  lines = [line for line in text.splitlines() if line.strip()]
  if len(lines) > max_prompts:
    raise UsageError(f"{what} holds {len(lines)} prompts, more than the --max_prompts cap of "
                     f"{max_prompts}: raise --max_prompts or split the prompts over several runs.")
  return lines


def check_bytes(text: str | bytes, what: str, max_bytes: int) -> None:
  """UsageError naming the --max_prompt_bytes cap if `text` holds more than `max_bytes` bytes."""
  size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
  if size > max_bytes:
    raise UsageError(f"{what} holds more than {max_bytes} bytes (the --max_prompt_bytes cap): "
                     "raise --max_prompt_bytes or split the prompts over several runs.")


def _utf8(raw: bytes, what: str) -> str:
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise UsageError(f"{what} is not valid UTF-8 (byte {raw[e.start:e.start + 1].hex()} at offset "
                     f"{e.start}): save it as UTF-8.") from None


def parse_token_ids(line: str, index: int) -> list[int]:
  """Prompt `index` given as comma-separated token ids ("1, 5,7") -> ints; UsageError naming the
  first empty, non-integer or negative element (nothing is dropped or joined)."""
  items = [x.strip() for x in line.split(",")]
  if not any(items):
    raise UsageError(f"Prompt {index} is empty.")
  for j, x in enumerate(items):
    digits = x[1:] if x.startswith("-") else x
    if not (digits.isascii() and digits.isdigit()):
      what = "empty" if not x else f"{x!r:.40}"
      raise UsageError(f"Prompt {index} is not a comma-separated list of token ids: element {j} "
                       f"is {what} in {line!r:.80}.")
    if x.startswith("-"):
      raise UsageError(f"Prompt {index} element {j} is {x:.40}: token ids are >= 0.")
    if len(digits) > MAX_ID_DIGITS:
      raise UsageError(f"Prompt {index} element {j} ({x:.20}...) has {len(x)} digits: it lies "
                       "outside the vocabulary.")
  return [int(x) for x in items]
