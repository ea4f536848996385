r"""Plain base-model language-model training of the tiny Llama on synthetic data (a demo base).

    python train.py --config configs/base_lm_tiny.py --workdir /tmp/base_lm_tiny

Writes an HF Llama directory to /tmp/base_lm_tiny/export, a valid starting point for HAMburger
fine-tuning: `--config configs/tiny.py --config.init.checkpoint=/tmp/base_lm_tiny/export`.
About 15 s on a 2-core CPU.
"""

from configs import tiny


def get_config():
  c = tiny.get_config()
  c.mode = "base_lm"
  c.num_train_steps = 100
  c.model.feature_layers = ()
  c.eval.every_steps = 50
  return c
