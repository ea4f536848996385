r"""Trains HAMburger (or a plain base LM) from a config file; logic lives in `hamburger_jax.train`.

    python train.py --config configs/tiny.py --workdir /tmp/hamburger_tiny
    python train.py --config configs/tiny.py --workdir /tmp/hamburger_tiny --config.num_train_steps=200

Re-running with the same --workdir resumes from its newest good checkpoint. Colab:
`train_and_evaluate(tiny.get_config(), "/tmp/hamburger_tiny")`.

Unusable settings, inputs or checkpoints, a diverged run and a full disk exit with code 2 after one
`error: ...` line on stderr. SIGTERM / SIGINT finish the current step, save it and exit with code
128 + the signal number (143 / 130) after one `stopped: ...` line.
"""

from hamburger_jax.train.command import run

if __name__ == "__main__":
  run()
