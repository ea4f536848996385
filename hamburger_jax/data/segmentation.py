"""Entropy segmentation: score response tokens with the base model, then group them (spec §7).

`Scorer` (model/scoring.py) runs the base model, jitted, on batches of prompt+response sequences
padded to a few length buckets (one compile per bucket), and returns for every token i the value
of the distribution that predicts it, i.e. the logits at position i - 1: its entropy, or
1 - p(token i) with metric 'probability'. `segment_examples` then turns each response's values
into group sizes with a strategy.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np

from hamburger_jax.data.strategies import SegmentationConfig, group_sizes
from hamburger_jax.data.tokenize import TokenizedExample
from hamburger_jax.model.scoring import Scorer


class SegmentedExample(NamedTuple):
  """The stored example: tokens int32 [T + R], T, and group sizes int32 [k] (sum = R)."""
  tokens: np.ndarray
  prompt_length: int
  steps: np.ndarray


def segment_examples(examples: Sequence[TokenizedExample], scorer: Scorer, cfg: SegmentationConfig,
                     on_batch: Callable[[int], None] | None = None) -> list[SegmentedExample]:
  """Scores and groups every response (in input order)."""
  seqs = [np.concatenate([ex.prompt, ex.response]).astype(np.int32) for ex in examples]
  values = scorer.score(seqs, on_batch)
  grouper_vocab = cfg.vocab_size or scorer.model_cfg.vocab_size
  out = []
  for ex, seq, v in zip(examples, seqs, values):
    t = len(ex.prompt)
    steps = group_sizes(v[t:], cfg, grouper_vocab)
    out.append(SegmentedExample(seq, t, steps))
  return out


def unit_segments(examples: Sequence[TokenizedExample]) -> list[SegmentedExample]:
  """Plain language-model data: every group has one token (no model needed)."""
  return [SegmentedExample(np.concatenate([ex.prompt, ex.response]).astype(np.int32),
                           len(ex.prompt), np.ones(len(ex.response), np.int32))
          for ex in examples]
