r"""Trains HAMburger (or a plain base LM) from a config file; logic lives in `hamburger_jax.train`.

    python train.py --config configs/tiny.py --workdir /tmp/hamburger_tiny
    python train.py --config configs/tiny.py --workdir /tmp/hamburger_tiny --config.num_train_steps=200

Re-running with the same --workdir resumes from its latest checkpoint. Colab:
`train_and_evaluate(tiny.get_config(), "/tmp/hamburger_tiny")`.
"""

import logging as py_logging

from absl import app, flags, logging
from ml_collections import config_flags

from hamburger_jax.train.loop import train_and_evaluate

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the final export.")
config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py).",
                                lock_config=True)
flags.mark_flags_as_required(["config", "workdir"])


class _QuietLibraries(py_logging.Filter):
  """Drops orbax's per-save INFO lines (they would bury the progress bar); keeps warnings."""

  def filter(self, record):
    return record.levelno >= py_logging.WARNING or "orbax" not in record.pathname


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.get_absl_handler().addFilter(_QuietLibraries())
  logging.info("Config:\n%s", FLAGS.config)
  train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  app.run(main)
