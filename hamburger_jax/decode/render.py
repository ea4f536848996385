"""How decode.py shows results: groups marked [..] or colored by probability, streamed text, the
one-line statistics summary, JSON output and the comparison with the base model alone."""

from __future__ import annotations

import collections
import json
import math
from typing import Callable, Sequence, TextIO

from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.decode.state import DecodeResult
from hamburger_jax.text.tokenizer import TextStream, Tokenizer


def _color(prob: float) -> str:
  """ANSI 256-color code: green (sure) .. red (unsure)."""
  for threshold, code in ((0.8, 34), (0.5, 148), (0.25, 214)):
    if prob >= threshold:
      return f"\x1b[38;5;{code}m"
  return "\x1b[38;5;196m"


def render_groups(groups: Sequence[Sequence[int]], logprobs: Sequence[float],
                  piece: Callable[[int], str], color: bool, sep: str = "") -> str:
  """Each group as [..] (plain) or closed by a dim bar with tokens colored by probability.

  `sep` goes between tokens and between groups (" " for token ids, "" for text pieces).
  """
  out, i = [], 0
  for group in groups:
    if color:
      body = sep.join(f"{_color(math.exp(logprobs[i + k]))}{piece(t)}"
                      for k, t in enumerate(group))
      out.append(f"{body}\x1b[0m\x1b[2m|\x1b[0m")
    else:
      out.append("[" + sep.join(piece(t) for t in group) + "]")
    i += len(group)
  return sep.join(out)


class Printer:
  """Formats one row's tokens as text or ids, with or without group marks."""

  def __init__(self, tokenizer: Tokenizer | None, show_groups: bool, color: bool):
    self.tok, self.show_groups, self.color = tokenizer, show_groups, color
    self.sep = " " if tokenizer is None else ""

  def piece(self, t: int) -> str:
    return str(t) if self.tok is None else self.tok.decode([t], skip_special=False)

  def groups(self, groups, logprobs) -> str:
    return render_groups(groups, logprobs, self.piece, self.color, self.sep)

  def full(self, tokens, groups, logprobs) -> str:
    if self.show_groups:
      return self.groups(groups, logprobs)
    if self.tok is None:
      return ",".join(str(t) for t in tokens)
    return self.tok.decode(tokens)


def stream_one(sampler: Sampler, prompt, printer: Printer, knobs: dict, chunk_steps: int,
               out: TextIO) -> DecodeResult:
  """Decodes one prompt in chunks of macro steps, printing as text appears."""
  text = TextStream(printer.tok) if printer.tok and not printer.show_groups else None
  shown_groups = shown_tokens = 0
  result = None
  for result in sampler.stream([prompt], chunk_steps=chunk_steps, **knobs):
    tokens, groups = result.tokens[0], result.groups(0)
    final = result.finish_reasons[0] != "running"
    if text is not None:
      out.write(text.update(tokens, final))
    elif printer.show_groups:
      start = sum(len(g) for g in groups[:shown_groups])
      if len(groups) > shown_groups:
        out.write((printer.sep if shown_groups else "") +
                  printer.groups(groups[shown_groups:], result.logprobs[0][start:]))
      shown_groups = len(groups)
    else:
      out.write(("," if shown_tokens else "") + ",".join(str(t) for t in tokens[shown_tokens:]))
      shown_tokens = len(tokens)
    out.flush()
  out.write("\n")
  return result


def summary(stats: dict) -> str:
  unit = "base forwards" if stats.get("mode") == "verify" else "macro steps"
  accept = ""
  if stats.get("acceptance"):
    accept = "; draft acceptance " + "/".join("-" if a is None else f"{a:.2f}"
                                                for a in stats["acceptance"])
  return (f"{stats['new_tokens']} new tokens in {stats['macro_steps']} {unit} "
          f"({stats['tokens_per_macro_step']:.2f} tokens/step{accept}); "
          f"KV slots {stats['kv_slots_used']} "
          f"(plain decoding: {stats['kv_slots_base']}); prefill {stats['prefill_s'] * 1e3:.1f} ms; "
          f"decode {stats['decode_tokens_per_s']:.1f} tokens/s; "
          f"compile {stats['compile_s']:.1f} s; "
          f"finish {finish_counts(stats['finish_reasons'])}")


def finish_counts(reasons) -> str:
  """'eos' for one row; 'eos x3, length x1' for several (a line stays short for any batch)."""
  if len(reasons) == 1:
    return reasons[0]
  counts = collections.Counter(reasons)
  return ", ".join(f"{name} x{n}" for name, n in sorted(counts.items()))


def print_json(prompts, result: DecodeResult, stats: dict, tokenizer: Tokenizer | None,
               out: TextIO) -> None:
  """{"outputs": one row per prompt (ids, tokens, groups, finish reason, probabilities, text),
  "stats": stats} as one JSON line."""
  rows = []
  for i, prompt in enumerate(prompts):
    row = {"prompt_ids": prompt, "tokens": result.tokens[i], "groups": result.groups(i),
           "finish_reason": result.finish_reasons[i],
           "probs": [round(math.exp(x), 6) for x in result.logprobs[i]]}
    if tokenizer is not None:
      row["text"] = tokenizer.decode(result.tokens[i])
    rows.append(row)
  json.dump({"outputs": rows, "stats": stats}, out)
  out.write("\n")


def print_comparison(b: dict, base_result: DecodeResult, tokenizer: Tokenizer | None, single: bool,
                     out: TextIO, err: TextIO) -> None:
  """The base model's text (one prompt, with a tokenizer) on `out`; the ratios of
  `evaluation.base_comparison` (b) on `err`."""
  if tokenizer is not None and single:
    print(f"--- base model alone:\n{tokenizer.decode(base_result.tokens[0])}", file=out)
  print(f"base model alone: {b['decode_tokens_per_s']:.1f} tokens/s; HAMburger/base speed "
        f"{b['speed_ratio']:.2f}x; KV entries {b['kv_slots_hamburger']} vs {b['kv_slots']}; "
        f"token agreement with the base {b['token_agreement']:.2f}", file=err)
