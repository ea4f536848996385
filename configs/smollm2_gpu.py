r"""HAMburger on SmolLM2-135M-Instruct, grafted modules only, on one GPU (`recipes.accelerate`).

    python -m hamburger_jax.recipes.smollm2 accelerate --minutes 8 --out DIR

configs/smollm2.py with the settings of the shipped weights' last stage (merge adapter of rank
64, stop target "correct") at a GPU batch. The recipe fills in what depends on the machine and the
data: init.checkpoint (the shipped weights on their base), data.data_dir, num_train_steps (timed
to the minutes given), checkpoint and eval cadence.
"""

from configs import smollm2


def get_config():
  c = smollm2.get_config()
  c.model.merge_adapter_rank = 64          # as the shipped weights
  c.model.dtype = "float32"                # the numbers the weights are decoded with
  c.model.attention = "xla"                # 256 packed positions: plain attention is cheap
  c.model.remat = "none"                   # activations of a 135M model fit many times over
  c.model.scan_layers = True               # compile time flat in depth (same param layout)
  c.init.checkpoint = ""                   # set by the recipe: shipped weights + base
  c.data.name = "smollm2_accelerate"
  c.data.data_dir = ""                     # set by the recipe
  c.data.batch_size = 64
  c.data.seq_len = 256
  c.loss.stop_target = "correct"
  c.optim.grafted_lr = 1.5e-4
  c.optim.end_lr = 2e-5
  c.optim.warmup_steps = 20
  c.checkpoint.keep = 2
  c.eval.every_steps = 0                   # the recipe evaluates before and after
  c.logging.every_steps = 10
  c.logging.tensorboard = False
  c.logging.progress_bar = False
  return c
