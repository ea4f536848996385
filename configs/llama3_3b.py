r"""HAMburger on Llama-3.2-3B(-Instruct): the paper's recipe (spec §6) at 3B, fsdp over the slice.

    python train.py --config configs/llama3_3b.py --workdir gs://bucket/hamburger_3b \
        --config.init.checkpoint=/path/to/Llama-3.2-3B-Instruct --config.data.source=tfds

Feature taps at the quarter points of the 28 layers (6, 13, 20). Memory plan not measured yet:
`python -m benchmarks.tpu_plan --train llama3_3b@v5p:2x2x1 --decode none` prints it.
"""

from configs import llama3_1b


def get_config():
  c = llama3_1b.get_config()
  c.model.preset = "llama3.2-3b"
  c.model.scan_layers = True
  return c
