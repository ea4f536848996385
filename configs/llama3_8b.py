r"""HAMburger on Llama-3.1-8B(-Instruct): the paper's recipe (spec §6) at 8B, fsdp over the slice.

    python train.py --config configs/llama3_8b.py --workdir gs://bucket/hamburger_8b \
        --config.init.checkpoint=/path/to/Llama-3.1-8B-Instruct --config.data.source=tfds

Feature taps at the quarter points of the 32 layers (7, 15, 23); untied LM head.

Fits a v5p slice of 4 chips (topology v5p:2x2x1, fsdp over the 4), measured with the XLA TPU
compiler ahead of time (`python -m benchmarks.tpu_plan --train llama3_8b@v5p:2x2x1 --decode
none`): at the 1B recipe's batch (64 x 2048, accumulation 2) the train step needs 82.4 GiB per
chip (25.2 arguments + 57.0 temporaries) of 95 GiB: 13% left; matmul FLOPs 1.31x the model
FLOPs; compile 501 CPU-seconds.
"""

from configs import llama3_1b


def get_config():
  c = llama3_1b.get_config()
  c.model.preset = "llama3.1-8b"
  c.model.scan_layers = True
  return c
