"""The engine thread: the one place that runs JAX while serving.

    worker = EngineWorker(engine, capacity=24).start()
    ticket = worker.submit(request, asyncio.get_running_loop())   # QueueFull when at capacity
    item = await ticket.queue.get()       # an engine Event, or a Failure
    worker.cancel(ticket)                 # timeouts, stop strings, clients that went away
    result = await worker.call(fn)        # fn() on the engine thread, between engine steps
    worker.close()                        # answers what is left with a Failure, joins the thread

The thread loops: take new submissions and cancellations from a thread-safe inbox, call
`engine.step()` while the engine has work, and hand each event to its request's asyncio queue with
`loop.call_soon_threadsafe`. `capacity` bounds the requests submitted and not yet finished
(running or waiting for a slot).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time

_log = logging.getLogger(__name__)
_IDLE_WAIT_S = 0.05


class QueueFull(RuntimeError):
  """Every slot and queue place is taken."""


class ShuttingDown(RuntimeError):
  """The worker no longer takes requests."""


@dataclasses.dataclass
class Failure:
  """A request the engine could not finish: HTTP status and a one-line message."""
  status: int
  message: str


class Ticket:
  """One submitted request and its way back: items arrive on `queue` (on the server's loop)."""

  def __init__(self, request, loop: asyncio.AbstractEventLoop):
    self.request = request
    self.queue: asyncio.Queue = asyncio.Queue()
    self.engine_id: int | None = None
    self.done = False                  # set by the worker thread once nothing more will come
    self._loop = loop

  def put(self, item) -> None:
    try:
      self._loop.call_soon_threadsafe(self.queue.put_nowait, item)
    except RuntimeError:               # the event loop is closed: nobody is listening any more
      pass


class EngineWorker:
  """Owns `engine` (ContinuousBatcher interface) on a background thread."""

  def __init__(self, engine, capacity: int):
    if capacity < 1:
      raise ValueError(f"capacity must be >= 1, got {capacity}.")
    self.engine = engine
    self.capacity = capacity
    self._inbox: queue.SimpleQueue = queue.SimpleQueue()
    self._lock = threading.Lock()
    self._pending = 0
    self._closed = False
    self._active: dict[int, Ticket] = {}
    self._thread = threading.Thread(target=self._run, name="hamburger-engine", daemon=True)
    self.stats = {"steps": 0, "step_s": 0.0, "events": 0, "engine_errors": 0}

  def start(self) -> "EngineWorker":
    self._thread.start()
    return self

  @property
  def pending(self) -> int:
    """Requests submitted and not finished yet."""
    return self._pending

  def submit(self, request, loop: asyncio.AbstractEventLoop) -> Ticket:
    """Queues `request` for the engine (any thread); QueueFull / ShuttingDown if it cannot."""
    with self._lock:
      if self._closed:
        raise ShuttingDown("The server is shutting down.")
      if self._pending >= self.capacity:
        raise QueueFull(f"All {self.capacity} request places are taken.")
      self._pending += 1
    ticket = Ticket(request, loop)
    self._inbox.put(("submit", ticket))
    return ticket

  def cancel(self, ticket: Ticket) -> None:
    """Stops decoding `ticket` (no-op once it is done)."""
    self._inbox.put(("cancel", ticket))

  def call(self, fn) -> asyncio.Future:
    """fn() run on the engine thread between two engine steps -> a future of its result (on
    the caller's event loop; ShuttingDown once the worker is closed)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    with self._lock:
      if self._closed:
        raise ShuttingDown("The server is shutting down.")
      self._inbox.put(("call", (fn, future, loop)))
    return future

  def close(self, timeout: float | None = None) -> None:
    """Takes no more requests; the thread answers unfinished ones with a Failure and exits."""
    with self._lock:
      self._closed = True
    self._inbox.put(("stop", None))
    self._thread.join(timeout)

  # -- the thread --

  def _run(self) -> None:
    while True:
      if self._take_inbox(block=not self.engine.has_work()):
        break
      if self.engine.has_work():
        self._step()
    for ticket in list(self._active.values()):
      self._finish(ticket, Failure(503, "The server shut down before this request finished."))

  def _take_inbox(self, block: bool) -> bool:
    """Handles every queued command (waiting briefly for one if `block`); True on stop."""
    try:
      items = [self._inbox.get(timeout=_IDLE_WAIT_S) if block else self._inbox.get_nowait()]
    except queue.Empty:
      return False
    while True:
      try:
        items.append(self._inbox.get_nowait())
      except queue.Empty:
        break
    stop = False
    for kind, item in items:
      if kind == "submit":
        self._submit(item)
      elif kind == "cancel":
        self._cancel(item)
      elif kind == "call":
        self._call(*item)
      else:
        stop = True
    return stop

  @staticmethod
  def _call(fn, future: asyncio.Future, loop: asyncio.AbstractEventLoop) -> None:
    def settle(ok: bool, value) -> None:
      if not future.done():
        (future.set_result if ok else future.set_exception)(value)
    try:
      result = (True, fn())
    except Exception as e:  # pylint: disable=broad-except
      _log.exception("engine call failed")
      result = (False, e)
    try:
      loop.call_soon_threadsafe(settle, *result)
    except RuntimeError:               # the event loop is closed: nobody is listening any more
      pass

  def _submit(self, ticket: Ticket) -> None:
    try:
      ticket.engine_id = self.engine.submit(ticket.request)
    except ValueError as e:            # the engine's own validation: a bad request
      self._finish(ticket, Failure(400, str(e)))
      return
    except Exception as e:  # pylint: disable=broad-except
      _log.exception("engine.submit failed")
      self._finish(ticket, Failure(500, f"The engine could not take the request: {e}"))
      return
    self._active[ticket.engine_id] = ticket

  def _cancel(self, ticket: Ticket) -> None:
    if ticket.done or ticket.engine_id not in self._active:
      return
    self.engine.cancel(ticket.engine_id)
    del self._active[ticket.engine_id]
    self._release(ticket)

  def _step(self) -> None:
    t0 = time.perf_counter()
    try:
      events = self.engine.step()
    except Exception as e:  # pylint: disable=broad-except
      _log.exception("engine.step failed")
      self.stats["engine_errors"] += 1
      for ticket in list(self._active.values()):
        self.engine.cancel(ticket.engine_id)
        self._finish(ticket, Failure(500, f"The engine failed while decoding: {e}"))
      return
    self.stats["steps"] += 1
    self.stats["step_s"] += time.perf_counter() - t0
    self.stats["events"] += len(events)
    for event in events:
      ticket = self._active.get(event.request_id)
      if ticket is None:               # cancelled meanwhile
        continue
      if event.finished:
        self._finish(ticket, event)
      else:
        ticket.put(event)

  def _finish(self, ticket: Ticket, item) -> None:
    """Delivers the last item of `ticket` and frees its place."""
    self._active.pop(ticket.engine_id, None)
    self._release(ticket)
    ticket.put(item)

  def _release(self, ticket: Ticket) -> None:
    ticket.done = True
    with self._lock:
      self._pending -= 1
