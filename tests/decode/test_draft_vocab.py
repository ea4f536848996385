"""Draft vocabularies: drafts (micro steps >= 1) choose from K token ids, micro step 0 from all.

The file format and its errors; on the small random model: the whole vocabulary in any order
decodes as without one, drafts come only from the K ids, no drafts is still the base's answer, the
continuous batcher decodes as the sampler alone, and no recompilation across knobs."""

import json

import dataclasses

import numpy as np
import pytest

from hamburger_jax.decode import draft_vocab as dv
from hamburger_jax.decode import loop as loop_lib
from hamburger_jax.decode.batching import ContinuousBatcher, Request
from hamburger_jax.decode.models import decode_model
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.testing.fixtures import random_params, tiny_config
from tests.decode.helpers import CACHE_LENGTH, OUT_LENGTH, small_model

PROMPTS = [[1, 17, 33, 250, 4], [1, 9, 3, 120, 77, 5, 6, 200, 11], [1, 2]]
KNOBS = dict(max_new_tokens=24, confidence=0.2, eos_ids=[])
SMALL_IDS = np.random.default_rng(1).permutation(256)[:64]


def _sampler(ids):
  cfg, params = small_model(0)
  return Sampler(cfg, params, cache_length=CACHE_LENGTH, out_length=OUT_LENGTH, draft_vocab=ids)


def test_most_frequent_orders_by_count_then_id():
  ids = dv.most_frequent([[5, 5, 3, 7], [7, 5, 9]], size=5, vocab_size=10)
  assert ids.tolist() == [5, 7, 3, 9, 0] and ids.dtype == np.int32
  assert dv.coverage([[5, 5, 3, 7], [7, 5, 9]], ids[:2]) == pytest.approx(5 / 7)
  with pytest.raises(dv.DraftVocabError, match="size must be in 1..10"):
    dv.most_frequent([[1]], size=11, vocab_size=10)


def test_save_and_load_round_trip(tmp_path):
  path = str(tmp_path / "draft.json")
  dv.save(path, np.array([4, 2, 9]), source="a test", coverage=0.5)
  assert dv.load(path, vocab_size=10).tolist() == [4, 2, 9]
  record = json.loads(open(path).read())
  assert record["source"] == "a test" and record["size"] == 3 and record["coverage"] == 0.5


@pytest.mark.parametrize("content, message", [
    (None, "no draft vocabulary at"),
    ("{not json", "invalid JSON"),
    (json.dumps({"ids": [1, 2]}), "expected format"),
    (json.dumps({"format": dv.FORMAT, "ids": [1, "2"]}), "must be a list of integers"),
    (json.dumps({"format": dv.FORMAT, "ids": [1, 99]}), r"must be in 0..9"),
    (json.dumps({"format": dv.FORMAT, "ids": [1, 1]}), "repeat"),
    (json.dumps({"format": dv.FORMAT, "ids": []}), "non-empty"),
])
def test_bad_files_give_one_line_errors(tmp_path, content, message):
  path = tmp_path / "draft.json"
  if content is not None:
    path.write_text(content)
  with pytest.raises(dv.DraftVocabError, match=message) as e:
    dv.load(str(path), vocab_size=10)
  assert "\n" not in str(e.value)


@pytest.mark.slow
def test_decode_model_checks_ids_and_gathers_head_rows():
  cfg, params = small_model(0)
  with pytest.raises(dv.DraftVocabError, match=r"0..255"):
    decode_model(cfg, params, draft_vocab=[3, 256])
  model, p = decode_model(cfg, params, draft_vocab=[7, 3])
  assert model.draft_size == 2
  embedding = np.asarray(params["base"]["embed_tokens"]["embedding"])
  others = [i for i in range(256) if i not in (7, 3)]        # fewer than REST_SAMPLE: all
  np.testing.assert_array_equal(p["draft"]["table"], embedding[[7, 3] + others])
  assert float(p["draft"]["rest_log_weight"]) == 0.0
  untied = dataclasses.replace(cfg, base=dataclasses.replace(cfg.base, tie_word_embeddings=False))
  untied_params = random_params(untied, 0)
  _, p = decode_model(untied, untied_params, draft_vocab=[7, 3])
  kernel = np.asarray(untied_params["base"]["lm_head"]["kernel"])        # [D, V]
  np.testing.assert_array_equal(p["draft"]["table"], kernel[:, [7, 3] + others].T)
  base_model, _ = decode_model(cfg, params, base=True, draft_vocab=[7, 3])
  assert base_model.draft_size == 0                                       # no drafts


@pytest.mark.slow
def test_a_drafts_probability_is_normalised_as_over_the_whole_vocabulary():
  import jax
  import jax.numpy as jnp
  cfg, params = small_model(0)
  hidden = jax.random.normal(jax.random.PRNGKey(3), (5, cfg.base.hidden_size)) * 3
  full, _ = decode_model(cfg, params)[0].heads(params, hidden)
  log_z = jax.nn.logsumexp(full, axis=-1)
  for sample, tolerance in ((1024, 1e-5), (96, 0.3)):      # all 192 others; half of them
    model, p = decode_model(cfg, params, draft_vocab=SMALL_IDS, rest_sample=sample)
    logits, _, rest = model.draft_heads(p, hidden)
    np.testing.assert_allclose(logits, np.asarray(full)[:, SMALL_IDS], rtol=1e-5, atol=1e-5)
    estimate = jax.nn.logsumexp(jnp.concatenate([logits, rest], axis=-1), axis=-1)
    np.testing.assert_allclose(estimate, log_z, atol=tolerance)
    subset_only = jax.nn.logsumexp(logits, axis=-1)          # what the estimate corrects
    assert np.mean(np.abs(estimate - log_z)) < 0.25 * np.mean(np.abs(subset_only - log_z))
  assert rest.shape == (5, 96)
  ids, weight = dv.rest_sample(SMALL_IDS, 256, 96)
  assert weight == 2.0 and not set(ids.tolist()) & set(SMALL_IDS.tolist()) and len(set(ids)) == 96


@pytest.mark.slow
def test_the_whole_vocabulary_in_any_order_decodes_as_without_one():
  full = _sampler(None).decode(PROMPTS, min_token_prob=0.01, **KNOBS)
  permuted = _sampler(np.random.default_rng(0).permutation(256)).decode(
      PROMPTS, min_token_prob=0.01, **KNOBS)
  assert permuted.tokens == full.tokens and permuted.group_sizes == full.group_sizes
  assert max(max(s) for s in full.group_sizes) > 1                        # drafts were kept
  np.testing.assert_allclose(np.concatenate(permuted.logprobs), np.concatenate(full.logprobs),
                             atol=1e-5)


@pytest.mark.slow
def test_drafts_come_only_from_the_draft_vocabulary():
  r = _sampler(SMALL_IDS).decode(PROMPTS, **KNOBS)
  allowed = set(SMALL_IDS.tolist())
  drafted = first = 0
  outside = False
  for row in range(len(PROMPTS)):
    i = 0
    for size in r.group_sizes[row]:
      outside |= r.tokens[row][i] not in allowed                 # step 0: any token
      assert all(t in allowed for t in r.tokens[row][i + 1:i + size])
      drafted += size - 1
      first += 1
      i += size
  assert drafted > 5 and outside


@pytest.mark.slow
def test_no_drafts_is_still_the_base_answer():
  cfg, params = small_model(0)
  base = Sampler(cfg, params, base=True, cache_length=CACHE_LENGTH, out_length=OUT_LENGTH)
  r = _sampler(SMALL_IDS).decode(PROMPTS, min_token_prob=1.0, **KNOBS)
  assert r.tokens == base.decode(PROMPTS, max_new_tokens=24, eos_ids=[]).tokens
  assert all(set(sizes) == {1} for sizes in r.group_sizes)


@pytest.mark.slow
def test_continuous_batcher_decodes_as_the_sampler_alone_without_recompiling():
  cfg, params = small_model(0)
  sampler = _sampler(SMALL_IDS)
  b = ContinuousBatcher(cfg, params, num_slots=2, cache_length=CACHE_LENGTH, chunk_steps=3,
                        draft_vocab=SMALL_IDS)
  requests = [Request(p, 12, c) for p, c in zip(PROMPTS, (0.2, 0.4, 0.3))]
  done = b.generate(requests)
  before = dict(loop_lib.TRACE_COUNTS)
  again = b.generate([Request(p, 10, 0.5, min_token_prob=0.3) for p in PROMPTS])
  assert {k: loop_lib.TRACE_COUNTS[k] - before.get(k, 0) for k in before} == {
      k: 0 for k in before}
  for req, c in zip(requests, done):
    alone = sampler.decode([req.prompt_ids], max_new_tokens=12, confidence=req.confidence)
    assert c.tokens == alone.tokens[0] and c.group_sizes == alone.group_sizes[0]
  assert all(c is not None for c in again)
