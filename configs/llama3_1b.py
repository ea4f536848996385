r"""The paper's recipe: HAMburger on Llama-3.2-1B-Instruct (spec §6).

    python train.py --config configs/llama3_1b.py --workdir gs://bucket/hamburger_1b \
        --config.init.checkpoint=/path/to/Llama-3.2-1B-Instruct --config.data.source=tfds \
        --config.data.name=hamburger_sft

AdamW, lr 5e-5 (base) / 1e-4 (grafted), cosine to 1e-5, clip 1.0, accumulation 2, bf16 compute
with f32 master weights, one epoch (set num_train_steps to one pass over the data).

Fits a v5e-8 slice (topology v5e:2x4, fsdp over the 8 chips), measured with the XLA TPU compiler
ahead of time (benchmarks.tpu_plan, libtpu 0.0.42 on a 2-core CPU host): at the full batch
(64 x 2048, accumulation 2) the train step needs 9.75 GiB per chip (7.49 of them temporaries) of
15.75 GiB: 38% left; its matmuls do 4016 TFLOP per step over the 8 chips, 1.33x the model FLOPs
(6 x params x tokens + attention). Compiling it took 422 CPU-seconds (1364 s wall on the shared
host). Defaults used: splash attention, full remat, scanned layers, loss chunks of 64.
"""

from configs import default


def get_config():
  c = default.get_config()
  c.model.preset = "llama3.2-1b"
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "float32"
  c.data.batch_size = 64
  c.data.seq_len = 2048
  c.num_train_steps = 20_000
  c.optim.grad_accum_steps = 2
  c.model.scan_layers = True
  c.mesh.data = 1
  c.mesh.fsdp = -1
  c.mesh.tensor = 1
  c.checkpoint.every_steps = 500
  c.eval.every_steps = 500
  c.eval.num_batches = 20
  return c
