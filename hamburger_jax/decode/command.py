"""The `decode.py` / `hamburger-decode` command: absl flags (one per DecodeArgs field) around
`hamburger_jax.decode.cli.run`. Importing this module defines the flags.
"""


import sys

from absl import app, flags, logging

from hamburger_jax.decode import cli as decode_cli

decode_cli.define_flags(flags)
FLAGS = flags.FLAGS


def _parse_flags(argv):
  """absl's parser, but a bad flag exits with code 2 and a one-line message."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


def main(argv):
  logging.set_verbosity(logging.WARNING)
  try:
    args = decode_cli.args_from_flags(FLAGS, argv[1:])   # positional arguments: the prompt
  except decode_cli.UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  sys.exit(decode_cli.run(args))


def run() -> None:
  """The `decode.py` / `hamburger-decode` command."""
  app.run(main, flags_parser=_parse_flags)
