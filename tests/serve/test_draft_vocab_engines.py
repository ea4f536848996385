"""The server's engines take a draft vocabulary (`--draft_vocab`): both decode a request as the
sampler alone does with it, and the flag parses."""

from __future__ import annotations

import pytest

from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.serve.cli import parse_args

from tests.serve.conftest import CACHE_LENGTH, decode_alone, make_engine

IDS = [3, 9, 17, 40, 41, 100, 200, 255]


@pytest.mark.slow
def test_both_engines_draft_from_the_vocabulary_as_the_sampler_does(tiny_model):
  cfg, params = tiny_model
  prompt = [1, 7, 30, 2]
  alone = Sampler(cfg, params, cache_length=CACHE_LENGTH, draft_vocab=IDS).decode(
      [prompt], max_new_tokens=16, confidence=0.05, eos_ids=cfg.base.eos_token_ids)
  assert max(alone.group_sizes[0]) > 1
  for kind in ("serial", "continuous"):
    engine = make_engine(kind, cfg, params, draft_vocab=IDS)
    assert decode_alone(engine, prompt, 16) == alone.tokens[0], kind


def test_the_flag_parses():
  assert parse_args(["--ckpt", "x"]).draft_vocab is None
  assert parse_args(["--ckpt", "x", "--draft_vocab", "full"]).draft_vocab == "full"
