"""Many prompts decoded in chunks of at most `batch_size` rows by one Sampler (one compile per
batch bucket), each chunk handed on as it finishes, then merged into one result.

    result, base = decode_chunks(sampler, prompts, knobs, batch_size=32,
                                 on_chunk=lambda start, r, base: ...)

With a `base` sampler (decode.py --compare_base) each chunk is also decoded by the base alone,
and a chunk whose bucket (rows, prefill length) is new is decoded once untimed first, so the
timed runs never include compiling.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from hamburger_jax.decode.compile_cache import next_pow2
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.decode.state import DecodeResult


def decode_chunks(sampler: Sampler, prompts: Sequence[Sequence[int]], knobs: dict,
                  batch_size: int, base: Sampler | None = None,
                  on_chunk: Callable[[int, DecodeResult, DecodeResult | None], None] | None = None
                  ) -> tuple[DecodeResult, DecodeResult | None]:
  """-> (the merged result of all prompts, the base's or None). on_chunk(start, result,
  base_result) runs after each chunk; start = the index of its first prompt."""
  base_knobs = dict(knobs, max_group=None, confidence=1.0)
  seen, results, base_results = set(), [], []
  for start in range(0, len(prompts), batch_size):
    chunk = list(prompts[start:start + batch_size])
    base_result = None
    if base is not None:
      bucket = (next_pow2(len(chunk)), sampler.prompt_bucket(chunk))
      if bucket not in seen:
        seen.add(bucket)
        base.decode(chunk, **base_knobs)                     # compile once, then time
        sampler.decode(chunk, **knobs)
      base_result = base.decode(chunk, **base_knobs)
      base_results.append(base_result)
    results.append(sampler.decode(chunk, **knobs))
    if on_chunk is not None:
      on_chunk(start, results[-1], base_result)
  return merge_results(results), merge_results(base_results) if base is not None else None


def merge_results(results: Sequence[DecodeResult]) -> DecodeResult:
  """One DecodeResult holding the rows of `results` in order; loop iterations, timings and draft
  counts summed (the chunks ran one after another)."""
  if len(results) == 1:
    return results[0]
  rows = lambda name: [row for r in results for row in getattr(r, name)]
  total = lambda name: sum(getattr(r, name) for r in results)
  counts = None
  if results[0].draft_counts is not None:
    counts = np.sum([r.draft_counts for r in results], axis=0).tolist()
  return DecodeResult(
      tokens=rows("tokens"), group_sizes=rows("group_sizes"), logprobs=rows("logprobs"),
      logits=rows("logits"), stop_logits=rows("stop_logits"),
      finish_reasons=rows("finish_reasons"), macro_steps=rows("macro_steps"),
      prompt_lengths=rows("prompt_lengths"), iterations=total("iterations"),
      compile_s=total("compile_s"), prefill_s=total("prefill_s"), decode_s=total("decode_s"),
      draft_counts=counts)
