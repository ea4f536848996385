"""The `train.py` / `hamburger-train` command: absl flags (--config file + --config.x=y overrides,
--workdir) around `train_and_evaluate`, with one-line errors and signal exit codes.

Importing this module defines the absl flags; library code imports `hamburger_jax.train.loop`.
"""


import errno
import logging as py_logging
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from hamburger_jax.convert import CheckpointError
from hamburger_jax.data.sources import DataError
from hamburger_jax.train.checkpoints import RestoreError
from hamburger_jax.train.loop import check_workdir, train_and_evaluate
from hamburger_jax.train.run_config import ConfigError, validate_config
from hamburger_jax.train.signals import Interrupted

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the final export.")
config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py).",
                                lock_config=True)
flags.mark_flags_as_required(["config", "workdir"])

_CLEAR_ERRORS = (ConfigError, CheckpointError, DataError, RestoreError, FloatingPointError)
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES)


class _QuietLibraries(py_logging.Filter):
  """Drops orbax's per-save INFO lines (they would bury the progress bar) and the tracebacks its
  background save threads log (the same error reaches the main thread, which reports it)."""

  def filter(self, record):
    if "orbax" not in record.pathname:
      return True
    return record.levelno >= py_logging.WARNING and not record.exc_info


def _quiet_closed_loops() -> None:
  """After a failed async write, tensorstore's pending callbacks hit orbax's closed asyncio loop
  and each prints a 'RuntimeError: Event loop is closed' traceback: drop those, keep the rest."""
  def closed_loop(exc) -> bool:
    return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
  previous = sys.excepthook, sys.unraisablehook
  sys.excepthook = lambda t, e, tb: None if closed_loop(e) else previous[0](t, e, tb)
  sys.unraisablehook = lambda u: None if closed_loop(u.exc_value) else previous[1](u)


def _fail(message) -> None:
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def _config_override_error(e: Exception, argv) -> str:
  """One line for a failed --config.x=y: which argument, and why."""
  name = str(e).strip("'\" ")
  args = [a for a in argv[1:] if a.startswith("--config.")]
  culprit = next((a for a in args if f".{name}=" in a or a.split("=")[0].endswith(f".{name}")),
                 args[0] if args else "--config")
  if isinstance(e, (AttributeError, KeyError)):
    return (f"{culprit.split('=')[0]}: the config has no field {name!r} (see configs/default.py "
            "for every field).")
  return f"{culprit}: {e}"


def _config_file_arg(argv) -> str:
  """The value of --config in argv ("" if absent)."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg.split("=", 1)[1]
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return ""


def _config_file_error(e: BaseException, argv) -> str | None:
  """One line for a --config file that failed to load or run, else None (another error)."""
  path = _config_file_arg(argv)
  if isinstance(e, SyntaxError):
    return f"--config {path}: line {e.lineno}: {e.msg}: fix the config file."
  text = str(e)
  if "has no attribute 'get_config'" in text:
    return (f"--config {path}: the file defines no get_config(); a config file is a module whose "
            "get_config() returns an ml_collections.ConfigDict (see configs/tiny.py).")
  if "Error whilst parsing config file" in text:        # get_config() raised; keep its last line
    last = [line for line in text.splitlines() if line.strip()][-1].strip()
    return f"--config {path}: get_config() failed with {last}: fix the config file or its argument."
  return None


def _parse_flags(argv):
  """absl's parser; a bad flag, config file or config override exits with code 2 and one line."""
  try:
    return FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError, SyntaxError) as e:
    message = _config_file_error(e, argv)
    if message is not None:
      _fail(message)
    if isinstance(e, flags.Error):
      _fail(e)
    _fail(_config_override_error(e, argv))    # raised by config overrides


def _check_config_loaded() -> None:
  """Exits with one line when the --config file could not be read (ml_collections defers that
  error to the config's first use)."""
  try:
    FLAGS.config.get("mode")
  except OSError as e:
    reason = [line.strip() for line in str(e.__cause__ or e).splitlines() if line.strip()][-1]
    _fail(f"--config {config_flags.get_config_filename(FLAGS['config'])}: cannot be read "
          f"({reason}); pass a config file such as configs/tiny.py.")


def _write_error(e: BaseException) -> str | None:
  """The reason of a full disk / read-only place (also wrapped by orbax or tensorstore), else None."""
  while e is not None:
    if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
      return e.strerror or os.strerror(e.errno)
    found = [os.strerror(n) for n in _WRITE_ERRNOS if os.strerror(n) in str(e)]
    if found:
      return found[0]
    e = e.__cause__ or e.__context__
  return None


def _last_saved_step(workdir: str) -> str:
  d = os.path.join(workdir, "checkpoints")
  steps = sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []
  return f"step {steps[-1]}" if steps else "none"


def main(argv):
  if len(argv) > 1:
    _fail(f"Unexpected arguments: {argv[1:]} (settings are --config.FIELD=VALUE).")
  logging.get_absl_handler().addFilter(_QuietLibraries())
  _quiet_closed_loops()
  _check_config_loaded()
  try:
    validate_config(FLAGS.config)          # before the config is logged: errors stay one line
    check_workdir(FLAGS.workdir)
    logging.info("Config:\n%s", FLAGS.config)
    train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except Interrupted as e:
    print(f"stopped: {e}", file=sys.stderr)
    sys.exit(128 + e.signum)
  except _CLEAR_ERRORS as e:
    _fail(e)
  except Exception as e:  # a full disk surfaces as OSError or as orbax's / tensorstore's errors
    reason = _write_error(e)
    if reason is None:
      raise
    # orbax's abandoned write futures are logged by asyncio when collected ("exception was never
    # retrieved", with a traceback): the one line below already says what failed.
    py_logging.getLogger("asyncio").disabled = True
    _fail(f"cannot write to {FLAGS.workdir}: {reason}. Free space (or use another --workdir) and "
          f"rerun to resume from the last complete checkpoint ({_last_saved_step(FLAGS.workdir)}).")


def run() -> None:
  """The `train.py` / `hamburger-train` command."""
  app.run(main, flags_parser=_parse_flags)
