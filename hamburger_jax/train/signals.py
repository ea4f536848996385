"""SIGTERM / SIGINT during training: finish the current step, save, stop; a second signal stops now.

    with StopOnSignal() as stop:
      for step in ...:
        ...                                  # one training step
        if stop.requested: save; raise stop.interrupted(step, total)

`Interrupted` subclasses KeyboardInterrupt, so code that lets Ctrl-C through lets it through too;
train.py turns it into one line and the exit code 128 + signal number.
"""

from __future__ import annotations

import logging
import signal

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
  """Training stopped early on a signal; `step` is the last step taken (and saved if `saved`)."""

  def __init__(self, message: str, signum: int, step: int, saved: bool):
    super().__init__(message)
    self.signum, self.step, self.saved = signum, step, saved


class StopOnSignal:
  """Context manager: the first SIGTERM/SIGINT sets `requested`; a second one raises Interrupted
  at once (no save: the step in progress may be half done)."""

  def __init__(self):
    self.signum = None
    self._prev = {}

  @property
  def requested(self) -> bool:
    return self.signum is not None

  def _handle(self, signum, frame):
    del frame
    name = signal.Signals(signum).name
    if self.signum is not None:
      raise Interrupted(f"Second {name}: stopped at once without saving; the last saved "
                        "checkpoint is kept.", signum, -1, False)
    self.signum = signum
    logging.warning("%s received: finishing this step, saving a checkpoint and stopping "
                    "(send it again to stop at once without saving).", name)

  def interrupted(self, step: int, total: int, directory: str) -> Interrupted:
    name = signal.Signals(self.signum).name
    return Interrupted(f"Stopped early by {name} at step {step} of {total}; saved a checkpoint of "
                       f"step {step} in {directory}: rerun the same command to resume.",
                       self.signum, step, True)

  def __enter__(self):
    for sig in _SIGNALS:
      try:
        self._prev[sig] = signal.signal(sig, self._handle)
      except ValueError:            # not the main thread: leave signals alone
        pass
    return self

  def __exit__(self, *exc):
    for sig, prev in self._prev.items():
      signal.signal(sig, prev)
    self._prev = {}
