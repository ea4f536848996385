"""open_checkpoint: one loader for every decodable checkpoint, with clear errors."""

import os
import shutil

import numpy as np
import pytest

from hamburger_jax.convert import CheckpointError
from hamburger_jax.decode import draft_vocab
from hamburger_jax.decode.checkpoint import (DEFAULT_KNOBS, Decodable, UsageError, open_checkpoint,
                                             resolve_knobs)
from hamburger_jax.model.config import HamburgerConfig
from hamburger_jax.testing.fixtures import make_tiny_checkpoint
from tests.text.test_tokenizer import CHATML, write_word_tokenizer


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  return make_tiny_checkpoint(str(tmp_path_factory.mktemp("ckpt") / "tiny"))


def test_tiny_checkpoint_gives_config_params_and_default_knobs(ckpt):
  d = open_checkpoint(ckpt, token_ids=True)
  assert isinstance(d, Decodable) and isinstance(d.config, HamburgerConfig)
  assert d.llama == d.config.base and {"base", "micro_decoder"} <= set(d.params)
  assert not d.base_only and d.knob_defaults == DEFAULT_KNOBS
  assert (d.chat, d.system, d.fence_ids, d.draft_vocab) == (False, None, (), None)
  assert d.eos_ids == tuple(sorted(set(d.llama.eos_token_ids)))


def test_missing_path_names_it(tmp_path):
  missing = str(tmp_path / "nope")
  with pytest.raises(CheckpointError, match=f"No such checkpoint: {missing}"):
    open_checkpoint(missing, token_ids=True)


def test_unreadable_checkpoint_is_a_checkpoint_error(tmp_path):
  (tmp_path / "empty").mkdir()
  with pytest.raises(CheckpointError):
    open_checkpoint(str(tmp_path / "empty"), token_ids=True)


def test_token_ids_means_no_tokenizer_and_else_one_is_required(ckpt):
  assert open_checkpoint(ckpt, token_ids=True).tokenizer is None
  with pytest.raises(UsageError, match="No tokenizer: pass --tokenizer"):
    open_checkpoint(ckpt)


def test_base_decodes_without_drafts(ckpt, tmp_path):
  own = str(tmp_path / "own")
  shutil.copytree(ckpt, own)
  tok = write_word_tokenizer(own, CHATML)
  draft_vocab.save(os.path.join(own, draft_vocab.FILE_NAME), [5, 9, 2], source="a test")
  assert open_checkpoint(own).draft_vocab.tolist() == [5, 9, 2]
  d = open_checkpoint(own, base=True)
  assert d.base_only and d.draft_vocab is None and d.fence_ids == ()
  assert d.tokenizer is not None and d.tokenizer.path == tok


def test_tokenizer_beside_the_checkpoint_gives_chat_stop_ids(ckpt, tmp_path):
  own = str(tmp_path / "own")
  shutil.copytree(ckpt, own)
  write_word_tokenizer(own, CHATML)
  plain = open_checkpoint(own)
  chat = open_checkpoint(own, chat=True, system="Be brief.", code_fences=False)
  im_end = plain.tokenizer.vocab["<|im_end|>"]
  assert im_end not in plain.eos_ids and im_end in chat.eos_ids
  assert (plain.chat, chat.chat, chat.system) == (False, True, "Be brief.")


def test_a_bad_draft_vocabulary_is_a_usage_error(ckpt, tmp_path):
  with pytest.raises(UsageError, match="--draft_vocab: no draft vocabulary at"):
    open_checkpoint(ckpt, token_ids=True, draft_vocab=str(tmp_path / "none.json"))
  assert open_checkpoint(ckpt, token_ids=True, draft_vocab="full").draft_vocab is None


def test_knobs_given_then_recommended_then_default():
  assert resolve_knobs({}, {}) == DEFAULT_KNOBS
  assert resolve_knobs({"confidence": None}, {"confidence": 0.9}) == {"confidence": 0.9,
                                                                       "min_token_prob": 0.0}
  assert resolve_knobs({"confidence": 0.5, "min_token_prob": 0.2},
                       {"confidence": 0.9, "min_token_prob": 0.3}) == {"confidence": 0.5,
                                                                        "min_token_prob": 0.2}
  assert np.isclose(resolve_knobs({"min_token_prob": 0.0}, {"min_token_prob": 0.3})
                    ["min_token_prob"], 0.0)
