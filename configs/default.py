r"""Default experiment: HAMburger fine-tuning with the spec §6 recipe (every field documented).

    python train.py --config configs/default.py --workdir /tmp/hamburger_default \
        --config.init.checkpoint=/path/to/hf_llama_dir --config.data.source=tfds

Other configs (`tiny.py`, `llama3_1b.py`, `base_lm_tiny.py`) start from this one and override a
few fields; any field can also be set on the command line (`--config.optim.base_lr=1e-5`). An
unknown key is an error (the config is locked).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.mode = "hamburger"          # "hamburger": grafted model fine-tuning | "base_lm": plain LM
  c.seed = 0                    # random init (params) and synthetic data
  c.freeze_base = False         # True: only embedder + micro decoder train; base stays bit-identical
  c.num_train_steps = 10_000    # optimizer steps (each = data.batch_size rows)

  c.model = ml_collections.ConfigDict()
  # A hamburger_jax.model.config.PRESETS name (architecture, random init).
  c.model.preset = "llama3.2-1b"
  c.model.vocab_size = 0             # base-model overrides of the preset: 0 = keep the preset's
  c.model.hidden_size = 0            # D
  c.model.intermediate_size = 0      # MLP width
  c.model.num_layers = 0             # L base layers
  c.model.num_heads = 0              # query heads
  c.model.num_kv_heads = 0           # key/value heads (GQA)
  c.model.head_dim = 0               # per-head width
  c.model.max_steps = 0              # S tokens per macro step at most; 0 = preset (4)
  c.model.feature_layers = ()        # base layers tapped by the micro decoder; () = preset
  c.model.num_micro_layers = 0       # micro-decoder layers; 0 = preset (4)
  c.model.merger_heads = 0           # heads of the embedder's merge attention; 0 = preset (64)
  c.model.merge_adapter_rank = 0     # rank of the base-layer adapter that acts only at merged
                                     # inputs (hamburger_jax.model.merge_adapter); 0 = none
  c.model.max_targets = 0            # micro decoder on at most this many target positions per
                                     # row (prompt positions skipped); 0 = every position
  c.model.param_dtype = "float32"    # master weights (and optimizer state)
  c.model.dtype = "bfloat16"         # compute dtype of the matmuls
  # How the model computes (same numbers, less memory; hamburger_jax.model.execution):
  c.model.attention = "auto"         # packed-row attention: "auto" (splash on TPU, cuDNN on GPU,
                                     # blockwise on CPU past 1024 tokens, else xla) | "xla" |
                                     # "blockwise" (online softmax, any backend) | "splash" | "cudnn"
  c.model.attention_block = 512      # blockwise: keys per block
  c.model.remat = "full"             # per-layer rematerialisation (base and micro decoder): "none" |
                                     # "full" (keep layer inputs only) | "save_dots" (also matmul
                                     # outputs) | "save_inputs" (also normalised sublayer inputs)
  c.model.scan_layers = False        # base and micro-decoder layers as lax.scan over stacked
                                     # params (compile time flat in depth); same param layout

  c.init = ml_collections.ConfigDict()
  c.init.checkpoint = ""        # HF Llama dir | hamburger_jax export | original ckpt; "" = random

  c.data = ml_collections.ConfigDict()
  c.data.source = "synthetic"   # "synthetic" (patterned token data, no files) | "tfds" (hamburger_jax.data)
  c.data.name = ""              # tfds: dataset name (builder) or directory
  c.data.data_dir = ""          # tfds: data directory ("" = tfds default)
  c.data.train_split = "train"  # tfds: training split
  c.data.eval_split = "validation"  # tfds: held-out split for evaluation
  c.data.batch_size = 64        # global rows per optimizer step (all hosts, all micro-batches)
  c.data.seq_len = 512          # M macro positions per row (packed examples)
  c.data.prompt_len = (8, 64)   # synthetic: prompt length range [lo, hi] (BOS included)
  c.data.response_len = (16, 256)  # synthetic: response length range [lo, hi]
  c.data.num_workers = 0        # tfds/grain: worker processes (0 = in the main process)

  c.optim = ml_collections.ConfigDict()
  c.optim.name = "adamw"        # only AdamW
  c.optim.base_lr = 5e-5        # peak learning rate of the base model
  c.optim.grafted_lr = 1e-4     # peak learning rate of the embedder and micro decoder
  c.optim.end_lr = 1e-5         # cosine floor (absolute), reached at num_train_steps
  c.optim.warmup_steps = 100    # linear warmup from 0
  c.optim.b1 = 0.9              # Adam beta1
  c.optim.b2 = 0.999            # Adam beta2
  c.optim.eps = 1e-8            # Adam epsilon
  c.optim.weight_decay = 0.01   # decoupled decay (not on norms, biases, embeddings)
  c.optim.grad_clip_norm = 1.0  # global-norm clipping; 0 = off
  c.optim.grad_accum_steps = 2  # micro-batches per optimizer step (scan inside the step)

  c.loss = ml_collections.ConfigDict()
  c.loss.stop_weight = 0.5      # weight of the stop-head BCE
  c.loss.stop_target = "segments"  # stop-head target: "segments" (the group's end) | "correct"
                                # (also where the micro decoder's next prediction is wrong)
  c.loss.step_weights = ""      # CE weight per micro step, e.g. "4,1,1,1"; "" = equal
  c.loss.kl_weight = 0.0        # distillation: weight of KL(teacher || student); 0 = off
  c.loss.teacher_len = 0        # plain tokens per row for the teacher; 0 = seq_len * max_steps
  c.loss.chunk_size = 64        # LM head + CE/KL on this many macro positions at a time (float32
                                # logits [B, chunk, S, V], recomputed in the backward); 0 = all

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1              # data-parallel axis (-1 = all remaining devices)
  c.mesh.fsdp = 1               # parameter/optimizer-sharded data-parallel axis
  c.mesh.tensor = 1             # tensor-parallel axis (heads, MLP, vocab)
  c.distributed = "auto"        # jax.distributed.initialize(): "auto" (multi-host env) | "always" | "never"
  c.logical_axis_rules = (      # logical param / activation axis -> mesh axes
      ("batch", ("data", "fsdp")),
      ("activation_batch", ("data", "fsdp")),
      ("activation_length", None),
      ("activation_embed", None),
      ("activation_heads", "tensor"),
      ("activation_kv_heads", "tensor"),
      ("activation_mlp", "tensor"),
      ("activation_vocab", "tensor"),
      ("vocab", "tensor"),
      ("embed", "fsdp"),
      ("mlp", "tensor"),
      ("heads", "tensor"),
      ("kv_heads", "tensor"),
      ("norm", None),
      ("max_steps", None),
      ("stop", None),
  )

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every_steps = 1000   # async save interval (also on SIGTERM and at the end)
  c.checkpoint.keep = 3             # checkpoints kept
  c.checkpoint.async_save = True    # save in the background
  c.checkpoint.export = True        # write the params-only export to workdir/export at the end

  c.eval = ml_collections.ConfigDict()
  c.eval.every_steps = 1000     # evaluation interval (and at the end); 0 = never
  c.eval.num_batches = 10       # held-out batches per evaluation
  c.eval.batch_size = 0         # rows per eval batch; 0 = data.batch_size // grad_accum_steps

  c.logging = ml_collections.ConfigDict()
  c.logging.every_steps = 50    # host reads metrics (and checks for NaN) at these steps
  c.logging.tensorboard = True  # TensorBoard event files in workdir/tensorboard (tensorboardX)
  c.logging.progress_bar = True  # tqdm bar with loss and tokens/s
  return c
