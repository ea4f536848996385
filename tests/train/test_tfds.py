"""Training on a prepared TFDS dataset (grain pipeline); the iterator position resumes exactly."""

import shutil

import numpy as np
import pytest

from configs import tiny
from hamburger_jax.train import batches
from hamburger_jax.train.loop import train_and_evaluate
from hamburger_jax.train.run_config import model_config
from hamburger_jax.data import SegmentedExample, write_dataset
from hamburger_jax.train.metrics_writer import read_jsonl


def _examples(n, seed):
  cfg = model_config(tiny.get_config())
  gen = batches.SyntheticIterator(cfg, 32, 1, (2, 6), (4, 16), seed, "train", False, slice(None))
  rng, out = np.random.default_rng(seed), []
  for _ in range(n):
    prompt, response, steps = gen._example(rng)  # pylint: disable=protected-access
    out.append(SegmentedExample(np.concatenate([prompt, response]).astype(np.int32), len(prompt),
                                np.asarray(steps, np.int32)))
  return out


@pytest.mark.slow
def test_tfds_source_trains_and_resumes_the_data_position(tmp_path):
  data_dir = str(tmp_path / "data")
  train, valid = _examples(64, 0), _examples(16, 1)
  write_dataset({"train": lambda: train, "validation": lambda: valid}, data_dir, "tiny_sft",
                progress=False)
  c = tiny.get_config()
  c.update_from_flattened_dict({
      "data.source": "tfds", "data.name": "tiny_sft", "data.data_dir": data_dir,
      "num_train_steps": 6, "checkpoint.every_steps": 3, "logging.every_steps": 1,
      "eval.every_steps": 6, "checkpoint.export": False, "logging.progress_bar": False,
      "logging.tensorboard": False})
  full = tmp_path / "full"
  train_and_evaluate(c, str(full))
  rows = read_jsonl(str(full))
  losses = {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}
  assert sorted(losses) == list(range(1, 7))
  assert any("eval/loss" in r for r in rows)

  # A run that stopped at step 3 (only its step-3 checkpoint exists) continues with batches 4..6.
  resumed = tmp_path / "resumed"
  (resumed / "checkpoints").mkdir(parents=True)
  shutil.copytree(full / "checkpoints" / "3", resumed / "checkpoints" / "3")
  train_and_evaluate(c, str(resumed))
  again = {r["step"]: r["train/loss"] for r in read_jsonl(str(resumed)) if "train/loss" in r}
  assert sorted(again) == [4, 5, 6]
  for step, loss in again.items():
    assert loss == losses[step], step
