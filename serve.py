"""Serve a HAMburger (or plain Llama) checkpoint over an OpenAI-compatible HTTP API.
Logic: hamburger_jax/serve/.

    python serve.py --ckpt smollm2 --port 8000
    python decode.py --make_tiny_checkpoint /tmp/tiny_ckpt
    python serve.py --ckpt /tmp/tiny_ckpt --token_ids --engine serial

Bad input exits with code 2 and one line on stderr.
"""

import sys

from hamburger_jax.serve.cli import main

if __name__ == "__main__":
  sys.exit(main())
