r"""Tiny HAMburger fine-tuning on synthetic data: CPU-sized, trains in seconds (README, tests, CI).

    python train.py --config configs/tiny.py --workdir /tmp/hamburger_tiny

About 30 s on a 2-core laptop CPU (mostly compilation); the loss falls from ~5.8 to ~1.6.
"""

from configs import default


def get_config():
  c = default.get_config()
  c.num_train_steps = 100
  c.model.preset = "tiny"
  c.model.num_layers = 4
  c.model.feature_layers = (0, 1, 2)
  c.model.num_micro_layers = 1
  c.model.merger_heads = 4
  c.model.dtype = "float32"
  c.data.batch_size = 8
  c.data.seq_len = 32
  c.data.prompt_len = (2, 6)
  c.data.response_len = (4, 16)
  c.optim.base_lr = 1e-2
  c.optim.grafted_lr = 1e-2
  c.optim.end_lr = 1e-3
  c.optim.warmup_steps = 5
  c.optim.grad_accum_steps = 1
  c.checkpoint.every_steps = 50
  c.eval.every_steps = 50
  c.eval.num_batches = 2
  c.logging.every_steps = 10
  return c
