r"""HAMburger on Llama-3.2-3B(-Instruct): the paper's recipe (spec §6) at 3B, fsdp over the slice.

    python train.py --config configs/llama3_3b.py --workdir gs://bucket/hamburger_3b \
        --config.init.checkpoint=/path/to/Llama-3.2-3B-Instruct --config.data.source=tfds

Feature taps at the quarter points of the 28 layers (6, 13, 20). Fits a v5p-8 slice (topology
v5p:2x2x1, 4 chips, fsdp), measured with the XLA TPU compiler ahead of time
(`python -m benchmarks.tpu_plan --train llama3_3b@v5p:2x2x1 --decode none`, libtpu 0.0.42 on a
2-core CPU host): at the full batch (64 x 2048, accumulation 2) 38.64 GiB per chip (28.18 of them
temporaries) of 95: 59% left; matmuls 7817 TFLOP per step, 1.32x the model FLOPs; compile 397
CPU-seconds (243 s wall).
"""

from configs import llama3_1b


def get_config():
  c = llama3_1b.get_config()
  c.model.preset = "llama3.2-3b"
  c.model.scan_layers = True
  return c
