"""The jitted, bucketed scorer and the segmentation of responses."""

import collections

import jax
import numpy as np
import pytest

from hamburger_jax.data.segmentation import SegmentedExample, segment_examples, unit_segments
from hamburger_jax.model.scoring import Scorer, default_buckets
from hamburger_jax.data.stats import SegmentStats
from hamburger_jax.data.strategies import SegmentationConfig, group_sizes
from hamburger_jax.data.tokenize import TokenizedExample
from hamburger_jax.model.llama import LlamaModel


def _direct_logits(cfg, params, seqs):
  """Logits [L, V] of each sequence alone (zero-padded after its end to 32: causal, no effect)."""
  padded = np.zeros((len(seqs), 32), np.int32)
  for i, seq in enumerate(seqs):
    padded[i, :len(seq)] = seq
  logits = jax.jit(lambda p, x: LlamaModel(cfg).apply({"params": p}, x).logits)(params, padded)
  return [np.asarray(logits[i, :len(seq)]) for i, seq in enumerate(seqs)]


def test_default_buckets():
  assert default_buckets(100) == (32, 48, 64, 96, 128)
  assert default_buckets(32) == (32,)
  assert default_buckets(2048)[-2:] == (1536, 2048)


def test_values_are_those_of_the_predicting_position(tiny_model):
  cfg, params = tiny_model
  rng = np.random.default_rng(0)
  seqs = [rng.integers(0, cfg.vocab_size, n).astype(np.int32) for n in (5, 17, 30, 9)]
  ent = Scorer(cfg, params, "entropy", buckets=(16, 32), tokens_per_batch=64).score(seqs)
  prob = Scorer(cfg, params, "probability", buckets=(32,)).score(seqs)
  for seq, e, p, logits in zip(seqs, ent, prob, _direct_logits(cfg, params, seqs)):
    logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    expect_e = -(np.exp(logp) * logp).sum(-1)
    expect_p = 1 - np.exp(logp[np.arange(len(seq) - 1), seq[1:]])
    assert e.shape == p.shape == (len(seq),)
    assert e[0] == 0 and p[0] == 0
    np.testing.assert_allclose(e[1:], expect_e[:-1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(p[1:], expect_p, rtol=1e-4, atol=1e-5)


def test_one_compile_per_bucket(tiny_model):
  cfg, params = tiny_model
  scorer = Scorer(cfg, params, buckets=(8, 16), tokens_per_batch=32)
  assert (scorer.rows(8), scorer.rows(16)) == (4, 2)
  assert Scorer(cfg, params, buckets=(24,), tokens_per_batch=100).rows(24) == 4  # power of two
  rng = np.random.default_rng(1)
  seqs = [rng.integers(0, 50, n).astype(np.int32) for n in (3, 8, 5, 12, 16, 9, 2, 7, 4, 6)]
  batches = []
  jax.clear_caches()                 # count this test's compiles, not those earlier tests left
  before = scorer.num_traces
  scorer.score(seqs, on_batch=batches.append)
  assert scorer.num_traces - before == 2 and sum(batches) == len(seqs) and len(batches) == 4
  Scorer(cfg, params, buckets=(8, 16), tokens_per_batch=32).score(seqs[::-1])
  assert scorer.num_traces - before == 2
  with pytest.raises(ValueError, match="largest bucket"):
    scorer.score([np.zeros(17, np.int32)])


class _ArangeScorer:
  """Stands in for Scorer: value of token i is i."""

  class model_cfg:  # pylint: disable=invalid-name
    vocab_size = 100

  def score(self, seqs, on_batch=None):
    return [np.arange(len(s), dtype=np.float32) for s in seqs]


def test_segment_examples_groups_response_values_only():
  ex = TokenizedExample(np.array([5, 6, 7], np.int32), np.arange(10, 16, dtype=np.int32), "x")
  # Response values are 3..8; small_group with threshold 4.5: 3, 4 merge, the rest stand alone.
  cfg = SegmentationConfig("small_group", threshold=4.5)
  (seg,) = segment_examples([ex], _ArangeScorer(), cfg)
  assert seg.prompt_length == 3 and seg.tokens.tolist() == [5, 6, 7, 10, 11, 12, 13, 14, 15]
  assert seg.steps.tolist() == [2, 1, 1, 1, 1]


def test_segment_examples_with_the_model(tiny_model):
  cfg, params = tiny_model
  rng = np.random.default_rng(2)
  exs = [TokenizedExample(rng.integers(0, 512, t).astype(np.int32),
                          rng.integers(0, 512, r).astype(np.int32), str(i))
         for i, (t, r) in enumerate([(3, 9), (1, 1), (6, 20), (2, 5)])]
  scorer = Scorer(cfg, params, buckets=(32,))
  seg_cfg = SegmentationConfig("sliding", max_steps=3, vocab_size=128256)
  out = segment_examples(exs, scorer, seg_cfg)
  values = scorer.score([np.concatenate([e.prompt, e.response]) for e in exs])
  for ex, seg, v in zip(exs, out, values):
    assert seg.steps.sum() == len(ex.response) and seg.steps.max() <= 3
    assert seg.steps.tolist() == group_sizes(v[len(ex.prompt):], seg_cfg, 512).tolist()
  # A random model is uncertain everywhere: with H(0.7) of a 128256 vocabulary nothing merges
  # (entropies ~ ln 512 = 6.2 > 4.1); with the model's own 512 everything does, up to S.
  assert all(set(s.steps.tolist()) == {1} for s in out)
  loose = segment_examples(exs, scorer, SegmentationConfig("sliding", max_steps=3, threshold=99))
  assert [s.steps.tolist() for s in loose][2] == [3] * 6 + [2]


def test_unit_segments_and_stats():
  exs = [TokenizedExample(np.array([1], np.int32), np.array([4, 5, 6], np.int32), "a"),
         TokenizedExample(np.array([1, 2], np.int32), np.array([7], np.int32), "b")]
  segs = unit_segments(exs)
  assert [s.steps.tolist() for s in segs] == [[1, 1, 1], [1]]
  stats = SegmentStats().add_all(segs + [SegmentedExample(np.zeros(9), 3, np.array([4, 2]))])
  assert (stats.examples, stats.prompt_tokens, stats.response_tokens, stats.groups) == (3, 6, 10, 6)
  assert stats.histogram == collections.Counter({1: 4, 4: 1, 2: 1})
  assert stats.tokens_per_group == pytest.approx(10 / 6)
  text = stats.format({"skipped_empty_response": 2})
  assert "tokens per group  1.667" in text and "skipped_empty_response   2" in text
  assert stats.to_dict()["group_size_histogram"] == {"1": 4, "2": 1, "4": 1}


def test_few_sequences_use_few_rows(tiny_model):
  cfg, params = tiny_model
  scorer = Scorer(cfg, params, buckets=(8,), tokens_per_batch=256)     # 32 rows per full batch
  rng = np.random.default_rng(2)
  seqs = [rng.integers(0, 50, n).astype(np.int32) for n in (3, 8, 5)]
  shapes = [tokens.shape for _, tokens, _ in scorer._batches(seqs)]
  assert shapes == [(4, 8)], shapes
  full = Scorer(cfg, params, buckets=(8,), tokens_per_batch=32)          # 4 rows: same shape
  for a, b in zip(scorer.score(seqs), full.score(seqs)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
