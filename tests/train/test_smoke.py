"""A tiny HAMburger config trains on generated data: loss falls, eval/logs/checkpoints/export exist."""

import glob
import os

import jax
import numpy as np
import pytest

from configs import tiny
from hamburger_jax.train.loop import train_and_evaluate
from hamburger_jax.convert import load_model
from hamburger_jax.train.metrics_writer import read_jsonl


def make_config(**overrides):
  c = tiny.get_config()
  c.logging.progress_bar = False
  c.update_from_flattened_dict(overrides)
  return c


CONFIG = {"num_train_steps": 40, "logging.every_steps": 10, "eval.every_steps": 40,
          "checkpoint.every_steps": 20}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("smoke")
  state = train_and_evaluate(make_config(**CONFIG), str(workdir))
  return workdir, state


@pytest.mark.slow
def test_loss_goes_down(run):
  workdir, state = run
  assert int(state.step) == 40
  train = [r for r in read_jsonl(str(workdir)) if "train/loss" in r]
  assert [r["step"] for r in train] == [10, 20, 30, 40]
  losses = [r["train/loss"] for r in train]
  assert losses[-1] < 0.75 * losses[0], losses
  assert all(r["train/tokens_per_sec"] > 0 for r in train)
  assert all(np.isfinite(r["train/grad_norm"]) for r in train)


def test_eval_metrics(run):
  workdir, _ = run
  (ev,) = [r for r in read_jsonl(str(workdir)) if "eval/loss" in r]
  assert ev["step"] == 40
  assert np.isclose(ev["eval/perplexity"], np.exp(ev["eval/label_loss"]), rtol=1e-5)
  for j in range(1, 5):
    assert 0.0 <= ev[f"eval/accuracy_s{j}"] <= 1.0
  assert 0.0 <= ev["eval/stop_accuracy"] <= 1.0
  assert 1.0 <= ev["eval/expected_tokens_per_step"] <= 4.0


def test_checkpoints_logs_and_export(run):
  workdir, state = run
  assert sorted(os.listdir(workdir / "checkpoints")) == ["20", "40"]
  events = glob.glob(str(workdir / "tensorboard" / "events.out.tfevents.*"))
  assert events and os.path.getsize(events[0]) > 0
  kind, cfg, params = load_model(str(workdir / "export"))
  assert kind == "hamburger" and cfg.max_steps == 4 and cfg.base.num_layers == 4
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(jax.device_get(state.params))):
    np.testing.assert_array_equal(a, b)


def test_finished_run_restarts_without_training(run):
  workdir, state = run
  rows = len(read_jsonl(str(workdir)))
  again = train_and_evaluate(make_config(**CONFIG), str(workdir))
  assert int(again.step) == 40
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(again.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert len(read_jsonl(str(workdir))) == rows        # nothing trained, nothing logged
