"""Decode with a HAMburger (or plain Llama) checkpoint. Logic: hamburger_jax/decode/cli.py;
the command: hamburger_jax/decode/command.py.

    python decode.py --make_tiny_checkpoint /tmp/tiny_ckpt
    python decode.py --ckpt /tmp/tiny_ckpt --token_ids 1,5,7 --json
    python decode.py --ckpt DIR --tokenizer DIR/tokenizer.json --chat --prompt "Hi" --show_groups

Bad input exits with code 2 and one line on stderr.
"""

from hamburger_jax.decode.command import run

if __name__ == "__main__":
  run()
