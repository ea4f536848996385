"""Typed validation of decode inputs: token-id prompts, prompt text, seeds and sampling knobs.

    ids = token_ids(prompt, index)      # a list of Python ints, or DecodeInputError
    text = utf8_text(line, "Prompt 0")  # str that encodes as UTF-8, or DecodeInputError
    check_seed(seed); check_temperature(t)

A prompt is a sequence of integers (Python or numpy ints): a string such as "157" is refused (it
would otherwise read as the ids 1, 5, 7), and so are floats, bools and nested lists.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

MAX_SEED = 2**32 - 1            # jax keys hold 32 bits: larger seeds would repeat smaller ones


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
