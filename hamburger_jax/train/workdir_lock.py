"""One run per training workdir: an exclusive `flock` on WORKDIR/.lock, held for the whole run.

    with WorkdirLock(workdir):          # WorkdirBusy (a ConfigError) if another run holds it
      ...                               # checkpoints, metrics, export

    check_free(workdir)                 # the same test without taking the lock (writes nothing)

The file records the holder as JSON ({"pid", "host", "started"}) so that a second run can name it.
The operating system drops the lock when its process dies, however it dies: a lock file left by a
killed run is simply taken over. The file itself stays (removing it would race with a new holder).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time

from hamburger_jax.train.run_config import ConfigError

LOCK_FILE = ".lock"


class WorkdirBusy(ConfigError):
  """Another run holds the workdir."""


def _holder(fd: int) -> str:
  """'pid P on host H, started T' from the lock file's record ('unknown holder' if unreadable)."""
  try:
    os.lseek(fd, 0, os.SEEK_SET)
    info = json.loads(os.read(fd, 4096).decode("utf-8"))
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["started"])))
    return f"pid {int(info['pid'])} on host {info['host']}, started {started}"
  except (OSError, ValueError, KeyError, TypeError):
    return "a run that has not written its details yet"


def _open(workdir: str) -> int:
  path = os.path.join(workdir, LOCK_FILE)
  try:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  except OSError as e:
    raise ConfigError(f"--workdir {workdir} is not writable ({e.strerror}): pass a directory "
                      "you can write to.") from e


def _lock_or_raise(fd: int, workdir: str) -> None:
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = _holder(fd)
    os.close(fd)
    raise WorkdirBusy(
        f"--workdir {workdir} is in use by another training run ({holder}): wait for it to "
        "finish or stop it, or pass another --workdir.") from None


def check_free(workdir: str) -> None:
  """WorkdirBusy if another run holds `workdir` (an existing directory); takes nothing."""
  fd = _open(workdir)
  _lock_or_raise(fd, workdir)
  fcntl.flock(fd, fcntl.LOCK_UN)
  os.close(fd)


class WorkdirLock:
  """Holds WORKDIR/.lock from `__enter__` to `__exit__` (the directory must exist)."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self._fd: int | None = None

  def __enter__(self) -> "WorkdirLock":
    fd = _open(self.workdir)
    _lock_or_raise(fd, self.workdir)
    previous = os.fstat(fd).st_size
    if previous:
      logging.info("Taking over %s left by a run that ended without releasing it (%s).",
                   os.path.join(self.workdir, LOCK_FILE), _holder(fd))
    record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                         "started": time.time()}).encode("utf-8")
    os.ftruncate(fd, 0)
    os.pwrite(fd, record, 0)
    self._fd = fd
    return self

  def __exit__(self, *exc) -> None:
    if self._fd is None:
      return
    try:
      os.ftruncate(self._fd, 0)              # released cleanly: no holder to name
    except OSError:
      pass
    fcntl.flock(self._fd, fcntl.LOCK_UN)
    os.close(self._fd)
    self._fd = None
