"""`python -m hamburger_jax.serve --ckpt smollm2`: see hamburger_jax/serve/cli.py."""

import sys

from hamburger_jax.serve.cli import main

sys.exit(main())
