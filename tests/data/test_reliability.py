"""prepare: a damaged existing dataset is named (not kept); names and inputs are checked before
the (slow) model load; the CLI answers bad input with one line and exit code 2."""

import os
import subprocess
import sys

import pytest

from tests.fixture_paths import REPO

from hamburger_jax.data import builder, prepare as prepare_lib
from hamburger_jax.data.prepare import PrepareConfig, prepare_dataset
from hamburger_jax.data.sources import DataError, SourceConfig
from hamburger_jax.data.strategies import SegmentationConfig
from hamburger_jax.data.tokenize import TokenizeConfig


def _lm_config(tmp_path, tokenizer_files, helpers, **kw):
  return PrepareConfig(SourceConfig(helpers.SAMPLE_JSONL, mode="lm", text_field="response"),
                       TokenizeConfig(tokenizer_files["plain"], mode="lm", max_length=64),
                       SegmentationConfig("sliding"), str(tmp_path / "d"), "lm", **kw)


def test_damaged_existing_dataset_is_named_and_rebuilt_with_overwrite(tmp_path, tokenizer_files,
                                                                     helpers):
  cfg = _lm_config(tmp_path, tokenizer_files, helpers)
  path = prepare_dataset(cfg, progress=False).path
  assert prepare_dataset(cfg, progress=False).skipped            # intact: kept
  shard = next(os.path.join(path, f) for f in os.listdir(path) if "array_record" in f)
  with open(shard, "r+b") as f:
    f.truncate(os.path.getsize(shard) // 2)
  with pytest.raises(DataError, match=r"exists but cannot be read .*pass --overwrite to rebuild"):
    prepare_dataset(cfg, progress=False)
  rebuilt = prepare_dataset(_lm_config(tmp_path, tokenizer_files, helpers, overwrite=True),
                            progress=False)
  assert not rebuilt.skipped and rebuilt.stats["examples"] == 24
  prepare_lib.check_existing(cfg.data_dir, "lm", builder.DEFAULT_VERSION)


def test_names_and_inputs_are_checked_before_the_model_loads(tmp_path, tokenizer_files, helpers,
                                                             monkeypatch):
  def no_model(*args, **kwargs):
    raise AssertionError("the model was loaded before the inputs were checked")
  monkeypatch.setattr(prepare_lib, "load_model", no_model)
  base = ["--tokenizer", tokenizer_files["llama3"], "--data_dir", str(tmp_path / "d"),
          "--no_progress"]
  with pytest.raises(ValueError, match="Dataset name 'bad name!'"):
    prepare_lib.main(base + ["--inputs", helpers.SAMPLE_JSONL, "--name", "bad name!"])
  with pytest.raises(DataError, match="does not exist"):
    prepare_lib.main(base + ["--inputs", str(tmp_path / "missing.jsonl"), "--name", "ok"])
  with pytest.raises(ValueError, match="unknown preset 'huge'"):
    prepare_lib.main(base + ["--inputs", helpers.SAMPLE_JSONL, "--name", "ok",
                             "--model", "random:huge"])


def test_cli_bad_input_is_one_line_with_exit_code_2(tmp_path, tokenizer_files):
  root = REPO
  proc = subprocess.run(
      [sys.executable, "-m", "hamburger_jax.data.prepare", "--inputs", str(tmp_path / "nope"),
       "--tokenizer", tokenizer_files["llama3"], "--data_dir", str(tmp_path), "--name", "x"],
      capture_output=True, text=True, cwd=root, env=dict(os.environ, JAX_PLATFORMS="cpu"),
      timeout=300)
  assert proc.returncode == 2
  assert proc.stderr.startswith("error: Input") and proc.stderr.count("\n") == 1
