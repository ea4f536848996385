r"""HAMburger on Llama-3.1-8B(-Instruct): the paper's recipe (spec §6) at 8B, fsdp over the slice.

    python train.py --config configs/llama3_8b.py --workdir gs://bucket/hamburger_8b \
        --config.init.checkpoint=/path/to/Llama-3.1-8B-Instruct --config.data.source=tfds

Feature taps at the quarter points of the 32 layers (7, 15, 23); untied LM head. Memory plan not
measured yet: `python -m benchmarks.tpu_plan --train llama3_8b@v5p:2x2x2 --decode none`.
"""

from configs import llama3_1b


def get_config():
  c = llama3_1b.get_config()
  c.model.preset = "llama3.1-8b"
  c.model.scan_layers = True
  return c
