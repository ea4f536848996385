"""Configs (presets, HF config.json) and the host-side batch builder."""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.fixture_paths import OFFICIAL_TINY
from hamburger_jax.model.batch import example_to_macro, make_batch
from hamburger_jax.model.config import HamburgerConfig, LlamaConfig, get_preset


def test_presets_are_hashable_and_match_fixture_config():
  cfg = get_preset("tiny")
  assert hash(cfg) == hash(get_preset("tiny"))
  hf = LlamaConfig.from_hf_json(f"{OFFICIAL_TINY}/config.json")
  assert hf == cfg.base
  big = get_preset("llama3.2-1b")
  assert (big.base.num_layers, big.base.hidden_size, big.base.num_kv_heads) == (16, 2048, 8)
  assert big.feature_layers == (3, 7, 11) and big.merger_heads == 64 and big.max_steps == 4
  with pytest.raises(ValueError, match="Unknown model preset"):
    get_preset("llama-9000")


def test_config_roundtrips_and_validates():
  cfg = get_preset("tiny")
  assert HamburgerConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
  assert LlamaConfig.from_hf_dict(cfg.base.to_hf_dict()) == cfg.base
  with pytest.raises(ValueError, match="feature_layers"):
    cfg.replace(feature_layers=(3, 99))
  with pytest.raises(ValueError, match="multiple of num_kv_heads"):
    dataclasses.replace(cfg.base, num_kv_heads=3)
  with pytest.raises(ValueError, match="Unknown dtype"):
    dataclasses.replace(cfg.base, dtype="float8")


def test_macro_layout_of_one_example():
  m = example_to_macro([10, 11, 12], [20, 21, 22, 23, 24, 25], [1, 3, 2], max_steps=4)
  np.testing.assert_array_equal(m["positions"], [0, 1, 2, 3, 6])
  np.testing.assert_array_equal(m["group_lengths"], [1, 1, 1, 1, 3])
  np.testing.assert_array_equal(m["group_tokens"][4], [21, 22, 23, 0])
  np.testing.assert_array_equal(m["target_lengths"], [0, 0, 1, 3, 2])
  np.testing.assert_array_equal(m["target_tokens"][3], [21, 22, 23, 0])
  np.testing.assert_array_equal(m["target_tokens"][4], [24, 25, 0, 0])


@pytest.mark.parametrize("prompt,response,steps,match", [
    ([], [1], [1], "at least one prompt token"),
    ([1], [], [], "at least one response token"),
    ([1], [5, 6], [1], "sum\\(steps\\) = 1"),
    ([1], [5, 6, 7, 8, 9], [5], "in 1..4"),
])
def test_bad_examples(prompt, response, steps, match):
  with pytest.raises(ValueError, match=match):
    example_to_macro(prompt, response, steps, 4)


def test_too_long_example_names_the_fix():
  with pytest.raises(ValueError, match="raise seq_len"):
    make_batch([([1] * 10, [2], [1])], 4, seq_len=8)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.lists(st.integers(1, 4), min_size=1, max_size=5)),
                min_size=1, max_size=8))
def test_packing_keeps_every_target_once(specs):
  rng = np.random.RandomState(0)
  examples = [(rng.randint(3, 200, t), rng.randint(3, 200, sum(s)), s) for t, s in specs]
  batch = make_batch(examples, 4, seq_len=16)
  # Every response token appears exactly once as a target, in order within its example.
  got = [batch["target_tokens"][r, m, :batch["target_lengths"][r, m]]
         for r in range(batch["target_lengths"].shape[0])
         for m in range(16) if batch["target_lengths"][r, m]]
  want = sorted(np.concatenate([e[1] for e in examples]).tolist())
  assert sorted(np.concatenate(got).tolist()) == want
  # Segments are contiguous, positions restart at 0 with each segment.
  for r in range(batch["segment_ids"].shape[0]):
    seg, pos = batch["segment_ids"][r], batch["positions"][r]
    starts = np.flatnonzero(np.diff(np.concatenate([[0], seg])) != 0)
    assert all(pos[s] == 0 for s in starts if seg[s] > 0)
