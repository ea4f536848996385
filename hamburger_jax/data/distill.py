"""Self-distillation: replace every response by the base model's own (greedy) answer.

The decoder is any callable `generate(prompt_ids_list) -> response_ids_list` (lists of int lists;
e.g. a wrapper around `hamburger_jax.decode.sampler`). It should return each answer with its end token
and at most the budget it was given; answers are re-checked against `max_length` here.
"""

from __future__ import annotations

import collections
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from hamburger_jax.data.tokenize import TokenizeConfig, TokenizedExample, fit_length

GenerateFn = Callable[[Sequence[Sequence[int]]], Sequence[Sequence[int]]]

MIN_PROMPT_BUCKET = 32    # prefill lengths: powers of two from here up to max_prompt_tokens


def self_distill(examples: Iterable[TokenizedExample], generate: GenerateFn, cfg: TokenizeConfig,
                 batch_size: int = 32,
                 counters: collections.Counter | None = None) -> Iterator[TokenizedExample]:
  """Yields the examples with responses from `generate`, `batch_size` prompts per call.

  Empty answers are skipped (`counters['skipped_empty_distilled']`); long ones follow
  `cfg.overlong` like any response.
  """
  counters = collections.Counter() if counters is None else counters
  batch: list[TokenizedExample] = []

  def flush():
    prompts = [ex.prompt.tolist() for ex in batch]
    answers = list(generate(prompts))
    if len(answers) != len(prompts):
      raise ValueError(f"generate returned {len(answers)} answers for {len(prompts)} prompts.")
    for ex, answer in zip(batch, answers):
      answer = [int(t) for t in answer]
      if not answer:
        counters["skipped_empty_distilled"] += 1
        continue
      counters["distilled"] += 1
      for p, r in fit_length(ex.prompt, answer, cfg, counters):
        yield TokenizedExample(np.asarray(p, np.int32), np.asarray(r, np.int32), ex.origin)

  for ex in examples:
    batch.append(ex)
    if len(batch) == batch_size:
      yield from flush()
      batch = []
  if batch:
    yield from flush()


def sampler_generate(cfg, params, eos_ids: Sequence[int], max_prompt_tokens: int,
                     max_new_tokens: int) -> GenerateFn:
  """A greedy `generate` hook around the base model's batched decoder (one compile per batch
  size): answers end with their end token when the model stopped, else at max_new_tokens."""
  from hamburger_jax.decode.sampler import Sampler  # pylint: disable=g-import-not-at-top
  sampler = Sampler(cfg, params, base=True, cache_length=max_prompt_tokens + max_new_tokens,
                    out_length=max_new_tokens,
                    min_prompt_bucket=min(MIN_PROMPT_BUCKET, max_prompt_tokens),
                    eos_ids=list(eos_ids))

  def generate(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    return [list(t) for t in sampler.decode([list(p) for p in prompts],
                                            max_new_tokens=max_new_tokens).tokens]
  return generate


def answer_record(prompt: str, ids: Sequence[int], eos_ids: Sequence[int], decode) -> dict:
  """One distilled answer as stored: {prompt, response (end tokens dropped), finish: "eos" when the
  model stopped, else "length"}."""
  finish = "eos" if ids and ids[-1] in eos_ids else "length"
  return {"prompt": prompt, "response": decode([t for t in ids if t not in eos_ids]),
          "finish": finish}
