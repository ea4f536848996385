"""Bad configs fail with a clear error before anything is compiled; NaN losses stop the run."""

import os
import subprocess
import sys

import jax
import pytest

from configs import tiny
from hamburger_jax.train.loop import train_and_evaluate
from hamburger_jax.train.run_config import model_config, validate_config
from hamburger_jax.train.setup import Setup

from tests.fixture_paths import REPO


def _config(**overrides):
  c = tiny.get_config()
  c.logging.progress_bar = False
  c.update_from_flattened_dict(overrides)
  return c


@pytest.fixture
def compiles():
  """Names of the compile events seen during the test."""
  seen = []
  listener = lambda event, *a, **k: seen.append(event) if "compile" in event else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  yield seen
  jax.monitoring.unregister_event_duration_listener(listener)


@pytest.mark.parametrize("overrides, message", [
    ({"mesh.data": 2}, "needs 2 devices but 1 are available"),
    ({"mesh.tensor": 3, "mesh.data": -1}, "do not divide the 1 devices"),
    ({"data.batch_size": 6, "optim.grad_accum_steps": 4}, "data.batch_size=6 is not divisible"),
    ({"mode": "lm"}, "mode 'lm' is unknown"),
    ({"model.preset": "llama-7b"}, "model.preset 'llama-7b' is unknown"),
    ({"model.feature_layers": (0, 9)}, r"feature_layers \[9\] are outside"),
    ({"mode": "base_lm", "freeze_base": True}, "would train nothing"),
    ({"data.source": "files"}, "data.source 'files' is unknown"),
    ({"data.source": "tfds"}, "needs data.name and data.data_dir"),
    ({"data.response_len": (4, 40)}, "data.seq_len is 32"),
    ({"optim.name": "sgd"}, "only 'adamw'"),
    ({"loss.stop_target": "sometimes"}, "loss.stop_target must be one of"),
    ({"loss.step_weights": "4,1"}, "loss.step_weights must be 4 comma-separated"),
])
def test_bad_config_fails_before_compiling(tmp_path, compiles, overrides, message):
  with pytest.raises(ValueError, match=message):
    train_and_evaluate(_config(**overrides), str(tmp_path / "w"))
  assert compiles == []
  assert not os.path.exists(tmp_path / "w" / "checkpoints")
  jax.jit(lambda x: x + 1)(1.0)          # the listener does see compilations
  assert compiles


def test_unknown_key_is_an_error_in_python_and_on_the_command_line(tmp_path):
  c = _config()
  c.lock()
  with pytest.raises(AttributeError, match="learning_rate"):
    c.optim.learning_rate = 1e-3
  out = subprocess.run(
      [sys.executable, os.path.join(REPO, "train.py"), "--config", "configs/tiny.py",
       f"--workdir={tmp_path / 'w'}", "--config.optim.learning_rate=0.1"],
      cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
      timeout=300)
  assert out.returncode != 0
  assert "learning_rate" in out.stderr
  assert not os.path.exists(tmp_path / "w")


@pytest.mark.slow
def test_nan_loss_stops_with_the_step_and_keeps_the_good_checkpoint(tmp_path):
  c = _config(**{"num_train_steps": 20, "optim.base_lr": 1e30, "optim.grafted_lr": 1e30,
                 "optim.warmup_steps": 0, "optim.grad_clip_norm": 0.0,
                 "logging.every_steps": 5, "checkpoint.every_steps": 1,
                 "eval.every_steps": 0, "checkpoint.export": False})
  with pytest.raises(FloatingPointError, match=r"at step 2: training stopped. The last good "
                                               r"checkpoint is step 1"):
    train_and_evaluate(c, str(tmp_path))
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1"]


def test_paper_config_builds_abstractly():
  """configs/llama3_1b.py: shapes, shardings and the optimizer state via eval_shape (no memory)."""
  from configs import llama3_1b
  from hamburger_jax.train import sharding
  from hamburger_jax.model.hamburger import param_count
  c = llama3_1b.get_config()
  validate_config(c)
  setup = Setup(c, model_config(c), sharding.make_mesh(c.mesh))
  assert setup.cfg.base.num_layers == 16 and setup.cfg.base.dtype == "bfloat16"
  assert setup.abstract.params["base"]["embed_tokens"]["embedding"].dtype == jax.numpy.float32
  assert 1.2e9 < param_count(setup.abstract.params["base"]) < 1.3e9
  assert param_count(setup.abstract.opt_state) > 2 * param_count(setup.abstract.params)
  assert (c.optim.base_lr, c.optim.grafted_lr, c.optim.grad_accum_steps) == (5e-5, 1e-4, 2)


@pytest.mark.parametrize("name", ["default", "tiny", "base_lm_tiny", "llama3_1b", "smollm2"])
def test_every_shipped_config_validates(name):
  import importlib
  c = importlib.import_module(f"configs.{name}").get_config()
  validate_config(c)
  cfg = model_config(c)
  if name == "smollm2":   # the embedded default: frozen base, 2 micro layers on SmolLM2's shape
    assert c.freeze_base and cfg.num_micro_layers == 2 and cfg.feature_layers == (7, 14, 21)
    assert (cfg.base.num_layers, cfg.base.hidden_size, cfg.base.vocab_size) == (30, 576, 49152)
