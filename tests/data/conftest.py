"""Shared helpers of the data tests: tiny tokenizers, a tiny base model, prepared datasets."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from hamburger_jax.model.config import LlamaConfig
from hamburger_jax.data import builder
from hamburger_jax.data.segmentation import SegmentedExample
from hamburger_jax.model.llama import init_llama_params
from tests.fixture_paths import FIXTURES as FIXTURES_ROOT

FIXTURES = os.path.join(FIXTURES_ROOT, "data")
SAMPLE_JSONL = os.path.join(FIXTURES, "sample_sft.jsonl")

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"]
CHATML_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
PLAIN_SPECIALS = ["<s>", "</s>"]


def sample_pairs() -> list[tuple[str, str]]:
  with open(SAMPLE_JSONL, encoding="utf-8") as f:
    return [(r["prompt"], r["response"]) for r in map(json.loads, f)]


def train_tokenizer(path: str, specials: list[str], vocab_size: int = 320) -> str:
  """A byte-level BPE tokenizer trained on the sample sentences, saved as tokenizer.json."""
  # pylint: disable=g-import-not-at-top
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, trainers
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  texts = [t for pair in sample_pairs() for t in pair] * 4
  tok.train_from_iterator(texts, trainer)
  tok.save(path)
  return path


@pytest.fixture(scope="session")
def tokenizer_files(tmp_path_factory) -> dict[str, str]:
  """tokenizer.json paths by template family: 'llama3', 'chatml', 'plain'."""
  root = tmp_path_factory.mktemp("tokenizers")
  return {name: train_tokenizer(str(root / f"{name}.json"), specials)
          for name, specials in (("llama3", LLAMA3_SPECIALS), ("chatml", CHATML_SPECIALS),
                                 ("plain", PLAIN_SPECIALS))}


def tiny_llama(vocab_size: int, num_layers: int = 2) -> LlamaConfig:
  return LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                     num_layers=num_layers, num_heads=2, num_kv_heads=1, head_dim=16)


@pytest.fixture(scope="session")
def tiny_model():
  """(LlamaConfig, params) of a 2-layer random model with a 512-token vocabulary."""
  cfg = tiny_llama(512)
  return cfg, jax.jit(lambda key: init_llama_params(cfg, key))(jax.random.PRNGKey(0))


def random_examples(n: int, seed: int = 0, max_prompt: int = 6, max_response: int = 12,
                    max_steps: int = 4, vocab: int = 100) -> list[SegmentedExample]:
  """Random segmented examples (ids >= 3 so that 0 always means padding in tests)."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    t, r = int(rng.integers(1, max_prompt + 1)), int(rng.integers(1, max_response + 1))
    steps, left = [], r
    while left:
      steps.append(int(rng.integers(1, min(max_steps, left) + 1)))
      left -= steps[-1]
    out.append(SegmentedExample(rng.integers(3, vocab, t + r).astype(np.int32), t,
                                np.asarray(steps, np.int32)))
  return out


def write_examples(data_dir: str, name: str, examples, validation=None) -> str:
  splits = {"train": lambda: examples}
  if validation is not None:
    splits["validation"] = lambda: validation
  return builder.write_dataset(splits, data_dir, name, metadata={"max_steps": 4})


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  """A prepared dataset of 40 random examples: (data_dir, name, examples)."""
  data_dir = str(tmp_path_factory.mktemp("prepared"))
  examples = random_examples(40, seed=1)
  write_examples(data_dir, "rand", examples)
  return data_dir, "rand", examples


@pytest.fixture(scope="session")
def helpers():
  """The plain helper functions above, for test modules (no import of conftest needed)."""
  import types  # pylint: disable=g-import-not-at-top
  return types.SimpleNamespace(
      sample_pairs=sample_pairs, train_tokenizer=train_tokenizer, tiny_llama=tiny_llama,
      random_examples=random_examples, write_examples=write_examples, SAMPLE_JSONL=SAMPLE_JSONL,
      LLAMA3_SPECIALS=LLAMA3_SPECIALS, CHATML_SPECIALS=CHATML_SPECIALS,
      PLAIN_SPECIALS=PLAIN_SPECIALS)
