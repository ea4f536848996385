"""The server's engines decode verified (`--verify`): each answer is the base model's own."""

from __future__ import annotations

import pytest

from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.serve.cli import parse_args

from tests.serve.conftest import CACHE_LENGTH, decode_alone, make_engine


@pytest.mark.slow
def test_both_engines_answer_as_the_base(tiny_model):
  cfg, params = tiny_model
  prompt = [1, 7, 30, 2]
  base = Sampler(cfg, params, base=True, cache_length=CACHE_LENGTH).decode(
      [prompt], max_new_tokens=16, eos_ids=cfg.base.eos_token_ids)
  for kind in ("serial", "continuous"):
    engine = make_engine(kind, cfg, params, verify=True)
    assert decode_alone(engine, prompt, 16) == base.tokens[0], kind
    deeper = make_engine(kind, cfg, params, verify=True, verify_steps=6)   # --verify_steps 6
    assert decode_alone(deeper, prompt, 16) == base.tokens[0], kind


def test_the_flag_parses_and_base_with_verify_is_refused():
  from hamburger_jax.decode.prompts import UsageError  # pylint: disable=g-import-not-at-top
  from hamburger_jax.serve.cli import check_args  # pylint: disable=g-import-not-at-top
  assert not parse_args(["--ckpt", "x"]).verify
  assert parse_args(["--ckpt", "x", "--verify"]).verify
  with pytest.raises(UsageError, match="--verify"):
    check_args(parse_args(["--ckpt", "x", "--verify", "--base"]))
  assert parse_args(["--ckpt", "x", "--verify", "--verify_steps", "6"]).verify_steps == 6
  check_args(parse_args(["--ckpt", "x", "--verify_requests", "--verify_steps", "6"]))
  with pytest.raises(UsageError, match="add --verify"):
    check_args(parse_args(["--ckpt", "x", "--verify_steps", "6"]))
  with pytest.raises(UsageError, match="2..16"):
    check_args(parse_args(["--ckpt", "x", "--verify", "--verify_steps", "17"]))
  assert parse_args(["--ckpt", "x", "--verify", "--draft_branches", "3"]).draft_branches == 3
  assert parse_args(["--ckpt", "x", "--verify", "--lookup_drafts", "0"]).lookup_drafts == 0
  with pytest.raises(UsageError, match="add --verify"):
    check_args(parse_args(["--ckpt", "x", "--lookup_drafts", "3"]))
  with pytest.raises(UsageError, match="add --verify"):
    check_args(parse_args(["--ckpt", "x", "--draft_branches", "2"]))
