"""The static-shape training batch and the host-side helper that builds it.

An example is (prompt ids, response ids, steps) with `sum(steps) == len(response)`: the response is
cut, in order, into groups of `steps[i]` tokens (1 <= steps[i] <= S). The base model sees one input
per *macro* position: every prompt token on its own, then one merged input per response group
except the last (which is only a target). Several examples are packed into one row of M macro
positions; `segment_ids` keeps them from attending to each other.

Batch fields (B rows, M macro positions, S = max_steps), all int32:

  group_tokens    [B, M, S]  tokens of the input at each macro position (a prompt token sits in
                             column 0); zero-padded.
  group_lengths   [B, M]     tokens in that input: 1 for prompt tokens, s for a merged group,
                             0 for padding.
  positions       [B, M]     RoPE position: 0..T-1 for the prompt, then the real position of the
                             group's LAST token (previous position + s).
  segment_ids     [B, M]     1, 2, .. for the examples of a row; 0 for padding.
  target_tokens   [B, M, S]  the group that follows this position (teacher forcing); zero-padded.
  target_lengths  [B, M]     its size; 0 where the position predicts nothing (prompt positions
                             before the last prompt token, the last group, padding).

Plain language-model training uses the same format with every group of size 1.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

BATCH_FIELDS = ("group_tokens", "group_lengths", "positions", "segment_ids", "target_tokens",
                "target_lengths")


class Example(NamedTuple):
  prompt: Sequence[int]
  response: Sequence[int]
  steps: Sequence[int]


def validate_example(prompt, response, steps, max_steps: int) -> None:
  """Raises ValueError naming the problem when an example is malformed."""
  if len(prompt) < 1:
    raise ValueError("An example needs at least one prompt token (use BOS for plain LM data).")
  if len(response) < 1:
    raise ValueError("An example needs at least one response token.")
  steps = np.asarray(steps)
  if steps.ndim != 1 or len(steps) == 0:
    raise ValueError(f"steps must be a non-empty 1-D list of group sizes, got {steps!r}.")
  if steps.min() < 1 or steps.max() > max_steps:
    raise ValueError(f"Every group size must be in 1..{max_steps}; got {steps.tolist()}.")
  if int(steps.sum()) != len(response):
    raise ValueError(f"sum(steps) = {int(steps.sum())} but the response has {len(response)} tokens.")


def macro_length(prompt_len: int, num_groups: int) -> int:
  """Macro positions one example occupies: T prompt tokens + all groups but the last."""
  return prompt_len + num_groups - 1


def example_to_macro(prompt, response, steps, max_steps: int) -> dict[str, np.ndarray]:
  """One example as unpacked macro arrays of length T + n - 1 (the fields above, without B)."""
  validate_example(prompt, response, steps, max_steps)
  prompt = np.asarray(prompt, np.int32)
  response = np.asarray(response, np.int32)
  steps = np.asarray(steps, np.int64)
  t, n, s = len(prompt), len(steps), max_steps
  m = macro_length(t, n)
  starts = np.concatenate([[0], np.cumsum(steps)[:-1]])
  groups = np.zeros((n, s), np.int32)
  for g, (a, k) in enumerate(zip(starts, steps)):
    groups[g, :k] = response[a:a + k]

  out = {
      "group_tokens": np.zeros((m, s), np.int32),
      "group_lengths": np.zeros((m,), np.int32),
      "positions": np.zeros((m,), np.int32),
      "target_tokens": np.zeros((m, s), np.int32),
      "target_lengths": np.zeros((m,), np.int32),
  }
  out["group_tokens"][:t, 0] = prompt
  out["group_lengths"][:t] = 1
  out["positions"][:t] = np.arange(t)
  out["group_tokens"][t:] = groups[:-1]
  out["group_lengths"][t:] = steps[:-1]
  out["positions"][t:] = t - 1 + np.cumsum(steps)[:-1]
  out["target_tokens"][t - 1:] = groups
  out["target_lengths"][t - 1:] = steps
  return out


def first_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
  """Assigns items (in order) to the first row with room; returns the item indices per row."""
  rows: list[list[int]] = []
  free: list[int] = []
  for i, n in enumerate(lengths):
    if n > capacity:
      raise ValueError(f"Example {i} needs {n} macro positions but a row holds {capacity}: raise "
                       "seq_len or truncate/drop long examples.")
    for r, room in enumerate(free):
      if n <= room:
        rows[r].append(i)
        free[r] -= n
        break
    else:
      rows.append([i])
      free.append(capacity - n)
  return rows


def pack_rows(macros: Sequence[dict[str, np.ndarray]], rows: Sequence[Sequence[int]],
              seq_len: int, max_steps: int, num_rows: int | None = None) -> dict[str, np.ndarray]:
  """Packs unpacked macro examples into the static batch, `rows[r]` listing row r's examples."""
  num_rows = len(rows) if num_rows is None else num_rows
  if len(rows) > num_rows:
    raise ValueError(f"{len(rows)} rows are needed but the batch has {num_rows}.")
  batch = {
      "group_tokens": np.zeros((num_rows, seq_len, max_steps), np.int32),
      "group_lengths": np.zeros((num_rows, seq_len), np.int32),
      "positions": np.zeros((num_rows, seq_len), np.int32),
      "segment_ids": np.zeros((num_rows, seq_len), np.int32),
      "target_tokens": np.zeros((num_rows, seq_len, max_steps), np.int32),
      "target_lengths": np.zeros((num_rows, seq_len), np.int32),
  }
  for r, members in enumerate(rows):
    offset = 0
    for seg, i in enumerate(members, start=1):
      ex = macros[i]
      m = len(ex["group_lengths"])
      if offset + m > seq_len:
        raise ValueError(f"Row {r} overflows: {offset + m} > seq_len {seq_len}.")
      sl = slice(offset, offset + m)
      for k, v in ex.items():
        batch[k][r, sl] = v
      batch["segment_ids"][r, sl] = seg
      offset += m
  return batch


def make_batch(examples: Sequence[Example | tuple], max_steps: int, seq_len: int,
               num_rows: int | None = None, pack: bool = True) -> dict[str, np.ndarray]:
  """Lists of (prompt ids, response ids, steps) -> the static batch (first-fit packing).

  With `pack=False` every example gets a row of its own. `num_rows` pads the batch with empty
  rows (a ValueError if the examples need more).
  """
  macros = [example_to_macro(p, r, s, max_steps) for p, r, s in examples]
  lengths = [len(m["group_lengths"]) for m in macros]
  if pack:
    rows = first_fit(lengths, seq_len)
  else:
    for i, n in enumerate(lengths):
      if n > seq_len:
        raise ValueError(f"Example {i} needs {n} macro positions but a row holds {seq_len}.")
    rows = [[i] for i in range(len(macros))]
  return pack_rows(macros, rows, seq_len, max_steps, num_rows)
