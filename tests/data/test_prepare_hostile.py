"""Hostile input to data preparation: records that cannot be tokenized (a lone surrogate) are
skipped and counted with on_error=skip, named in one DataError without; out-of-range flags are
refused before any model load or scoring."""

import collections
import json
import os
import subprocess
import sys

import pytest

from hamburger_jax.data import prepare as prepare_lib
from hamburger_jax.data.prepare import PrepareConfig, prepare_dataset
from hamburger_jax.data.sources import DataError, RawExample, SourceConfig
from hamburger_jax.data.strategies import SegmentationConfig
from hamburger_jax.data.tokenize import ChatTokenizer, TokenizeConfig, tokenize_examples

from tests.fixture_paths import REPO

_SURROGATE = "a\ud800b"            # JSON's "a\\ud800b": valid JSON, not encodable text


def _jsonl_with_surrogates(tmp_path, helpers) -> str:
  lines = open(helpers.SAMPLE_JSONL, encoding="utf-8").read().splitlines()
  lines[2] = json.dumps({"prompt": "fine", "response": _SURROGATE})
  lines[5] = json.dumps({"prompt": _SURROGATE, "response": "fine"})
  path = tmp_path / "surrogates.jsonl"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return str(path)


def _config(tmp_path, tokenizer, inputs, **source):
  return PrepareConfig(SourceConfig(inputs, mode="lm", text_field="response", **source),
                       TokenizeConfig(tokenizer, mode="lm", max_length=64),
                       SegmentationConfig("sliding"), str(tmp_path / "d"), "lm")


def test_lone_surrogate_is_skipped_and_counted(tmp_path, tokenizer_files, helpers):
  path = _jsonl_with_surrogates(tmp_path, helpers)
  result = prepare_dataset(_config(tmp_path, tokenizer_files["plain"], path, on_error="skip"),
                           progress=False)
  assert result.counters["skipped_bad_encoding"] == 1      # lm mode reads the response only
  assert result.stats["examples"] == 23


def test_lone_surrogate_without_skip_names_the_record(tmp_path, tokenizer_files, helpers):
  path = _jsonl_with_surrogates(tmp_path, helpers)
  with pytest.raises(DataError, match=r"surrogates.jsonl:3: field 'response' holds '\\ud800'"):
    prepare_dataset(_config(tmp_path, tokenizer_files["plain"], path), progress=False)


def test_every_tokenize_failure_is_skipped_or_named(tokenizer_files):
  tok = ChatTokenizer(TokenizeConfig(tokenizer_files["llama3"], max_length=64))
  raws = [RawExample("hi", "there", None, "t:1"), RawExample(_SURROGATE, "x", None, "t:2"),
          RawExample("hi", _SURROGATE, None, "t:3"), RawExample("ok", "yes", None, "t:4")]
  counters = collections.Counter()
  kept = list(tokenize_examples(raws, tok, counters, on_error="skip"))
  assert [e.origin for e in kept] == ["t:1", "t:4"]
  assert counters["skipped_tokenize_error"] == 2
  with pytest.raises(DataError, match=r"^t:2: the record cannot be tokenized \(TypeError"):
    list(tokenize_examples(raws, tok))


@pytest.mark.parametrize("flags, message", [
    (["--ratio", "nan"], "ratio (--ratio) must be a finite number in [0, 1], got nan"),
    (["--ratio", "-0.5"], "ratio (--ratio) must be a finite number in [0, 1]"),
    (["--min_value", "inf"], "min_value (--min_value) must be a finite number"),
    (["--strategy", "sliding", "--threshold_p", "2"], "threshold_p (--threshold_p) must be a "
                                                      "finite number in (0, 1], got 2.0"),
    (["--strategy", "sliding", "--threshold_p", "0"], "threshold_p (--threshold_p)"),
    (["--threshold_vocab_size", "1"], "vocab_size (--threshold_vocab_size) must be >= 2"),
    (["--max_steps", "0"], "max_steps must be >= 1"),
    (["--chunk_size", "0"], "chunk_size (--chunk_size) must be >= 1"),
    (["--tokens_per_batch", "-1"], "tokens_per_batch (--tokens_per_batch) must be >= 1"),
    (["--eval_examples", "-1"], "eval_examples (--eval_examples) must be >= 0"),
    (["--max_examples", "0"], "max_examples (--max_examples) must be >= 1"),
    (["--max_length", "1"], "max_length must be at least 2"),
])
def test_flags_out_of_range_are_refused_before_any_work(tmp_path, tokenizer_files, helpers,
                                                        monkeypatch, flags, message):
  def no_work(*args, **kwargs):
    raise AssertionError("inputs were read or the model loaded before the flags were checked")
  monkeypatch.setattr(prepare_lib, "load_model", no_work)
  monkeypatch.setattr(prepare_lib, "read_examples", no_work)
  argv = ["--inputs", helpers.SAMPLE_JSONL, "--tokenizer", tokenizer_files["llama3"],
          "--data_dir", str(tmp_path / "d"), "--name", "ok", "--no_progress", *flags]
  with pytest.raises(ValueError) as e:
    prepare_lib.main(argv)
  assert message in str(e.value)


def test_cli_nan_ratio_is_one_line_with_exit_code_2(tmp_path, tokenizer_files, helpers):
  proc = subprocess.run(
      [sys.executable, "-m", "hamburger_jax.data.prepare", "--inputs", helpers.SAMPLE_JSONL,
       "--tokenizer", tokenizer_files["llama3"], "--data_dir", str(tmp_path), "--name", "x",
       "--ratio", "nan"],
      capture_output=True, text=True, cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"),
      timeout=300)
  assert proc.returncode == 2
  assert proc.stderr == "error: ratio (--ratio) must be a finite number in [0, 1], got nan.\n"
