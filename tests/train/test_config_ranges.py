"""Every numeric training setting is range-checked before any model load: learning rates finite and
>= 0, NaN refused, sizes >= 1, BOS/EOS ids inside the vocabulary; one ConfigError naming the field
(train.py: one `error:` line, exit 2)."""

import dataclasses
import math
import os
import subprocess
import sys

import pytest

from configs import tiny
from hamburger_jax.train.run_config import (ConfigError, check_token_ids, model_config,
                                            validate_config)

from tests.fixture_paths import REPO


def _config(field, value):
  c = tiny.get_config()
  c.update_from_flattened_dict({field: value})
  return c


@pytest.mark.parametrize("field, value, message", [
    ("optim.base_lr", -1.0, "optim.base_lr must be a finite number >= 0, got -1.0"),
    ("optim.grafted_lr", math.nan, "optim.grafted_lr must be a finite number >= 0, got nan"),
    ("optim.end_lr", math.inf, "optim.end_lr must be a finite number >= 0, got inf"),
    ("optim.b1", 1.0, r"optim.b1 must be a finite number in [0, 1), got 1.0"),
    ("optim.b2", -0.1, "optim.b2 must be a finite number in [0, 1)"),
    ("optim.eps", math.nan, "optim.eps must be a finite number >= 0"),
    ("optim.weight_decay", -0.01, "optim.weight_decay must be a finite number >= 0"),
    ("optim.grad_clip_norm", math.nan, "optim.grad_clip_norm"),
    ("loss.stop_weight", -0.5, "loss.stop_weight must be a finite number >= 0"),
    ("loss.kl_weight", math.nan, "loss.kl_weight"),
    ("data.batch_size", 0, "data.batch_size must be an integer >= 1, got 0"),
    ("data.seq_len", -1, "data.seq_len must be an integer >= 1, got -1"),
    ("optim.warmup_steps", -5, "optim.warmup_steps must be an integer >= 0"),
    ("eval.num_batches", 0, "eval.num_batches must be an integer >= 1"),
    ("eval.batch_size", -8, "eval.batch_size must be an integer >= 0"),
    ("loss.teacher_len", -1, "loss.teacher_len must be an integer >= 0"),
    ("model.attention_block", 0, "model.attention_block must be an integer >= 1"),
    ("model.max_targets", -1, "model.max_targets must be an integer >= 0"),
    ("model.num_heads", -2, "model.num_heads must be an integer >= 0"),
    ("data.num_workers", -1, "data.num_workers must be an integer >= 0"),
])
def test_out_of_range_settings_name_the_field(field, value, message):
  with pytest.raises(ConfigError) as e:
    validate_config(_config(field, value))
  assert str(e.value).startswith(message), str(e.value)
  assert f"--config.{field}" in str(e.value)


def test_the_tiny_config_and_zero_learning_rates_pass():
  validate_config(tiny.get_config())
  validate_config(_config("optim.base_lr", 0.0))


def test_eos_and_bos_outside_the_vocabulary():
  cfg = model_config(tiny.get_config())
  vocab = cfg.base.vocab_size
  check_token_ids(cfg, "x")
  eos = cfg.replace(base=dataclasses.replace(cfg.base, eos_token_ids=(2, vocab + 9999)))
  with pytest.raises(ConfigError, match=rf"eos_token_ids holds {vocab + 9999}, outside the "
                                        rf"vocabulary of {vocab} tokens of init.checkpoint /c"):
    check_token_ids(eos, "init.checkpoint /c")
  bos = cfg.replace(base=dataclasses.replace(cfg.base, bos_token_id=-1))
  with pytest.raises(ConfigError, match="bos_token_id holds -1"):
    check_token_ids(bos, "x")


@pytest.mark.parametrize("flag, message", [
    ("--config.data.batch_size=0", "error: data.batch_size must be an integer >= 1, got 0"),
    ("--config.optim.grafted_lr=nan", "error: optim.grafted_lr must be a finite number >= 0, "
                                      "got nan"),
])
def test_train_py_refuses_with_one_line(tmp_path, flag, message):
  out = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny.py",
                        f"--workdir={tmp_path / 'w'}", flag], cwd=REPO,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 2, out.stderr[-2000:]
  assert out.stderr.strip().splitlines() == [out.stderr.strip()]
  assert out.stderr.startswith(message), out.stderr
  assert not os.path.exists(tmp_path / "w")
