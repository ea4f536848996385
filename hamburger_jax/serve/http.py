"""Connection-level guards for uvicorn's h11 server: read deadlines and half-closed clients.

    config = uvicorn.Config(create_app(service), host=..., port=..., **uvicorn_options())

- A request's headers must arrive within `header_timeout_s` of its first byte (of the connection,
  for the first request) and its body within `body_timeout_s` of its headers; a client that
  stalls is disconnected (the app sees a hang-up and cancels the request). Idle keep-alive
  connections close after `keep_alive_s` (uvicorn's timeout_keep_alive).
- Headers are capped at `max_header_bytes` (h11's incomplete-event limit: 400 above it).
- A client that half-closes its side (shutdown(SHUT_WR)) after sending a whole request still gets
  the response; the connection closes once it is sent. A half-close before the request is whole
  closes the connection (no complete request can follow).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 60.0
KEEP_ALIVE_S = 5.0
MAX_HEADER_BYTES = 64 * 1024


class GuardedH11Protocol(H11Protocol):
  """uvicorn's H11Protocol with read deadlines and half-close support (class attributes set by
  `uvicorn_options`)."""

  header_timeout_s = HEADER_TIMEOUT_S
  body_timeout_s = BODY_TIMEOUT_S

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._deadline: asyncio.TimerHandle | None = None
    self._timed_cycle = None            # the request whose body deadline is armed
    self._half_closed = False

  def _arm(self, seconds: float) -> None:
    self._disarm()
    self._deadline = self.loop.call_later(seconds, self._read_timed_out)

  def _disarm(self) -> None:
    if self._deadline is not None:
      self._deadline.cancel()
      self._deadline = None

  def _between_requests(self) -> bool:
    return self.cycle is None or self.cycle.response_complete

  def _read_timed_out(self) -> None:
    self._deadline = None
    if not self.transport.is_closing():
      self.logger.info("Closing a connection that sent no whole request in time.")
      self.transport.close()

  def connection_made(self, transport) -> None:  # type: ignore[override]
    super().connection_made(transport)
    self._arm(self.header_timeout_s)

  def data_received(self, data: bytes) -> None:
    if self._deadline is None and self._between_requests():    # the next request begins
      self._arm(self.header_timeout_s)
    super().data_received(data)
    cycle = self.cycle
    if cycle is None or cycle.response_complete:
      return
    if not cycle.more_body:                 # the whole request is in
      self._disarm()
    elif cycle is not self._timed_cycle:    # its headers are in: now the body's deadline
      self._timed_cycle = cycle
      self._arm(self.body_timeout_s)

  def eof_received(self) -> bool | None:
    cycle = self.cycle
    if cycle is not None and not cycle.response_complete and not cycle.more_body:
      self._half_closed = True              # keep writing: its response is on the way
      return True
    return None                             # asyncio closes the transport

  def on_response_complete(self) -> None:
    super().on_response_complete()
    if self._half_closed and not self.transport.is_closing():
      self.transport.close()

  def connection_lost(self, exc) -> None:
    self._disarm()
    super().connection_lost(exc)


def uvicorn_options(header_timeout_s: float = HEADER_TIMEOUT_S,
                    body_timeout_s: float = BODY_TIMEOUT_S, keep_alive_s: float = KEEP_ALIVE_S,
                    max_header_bytes: int = MAX_HEADER_BYTES) -> dict:
  """Keyword arguments of `uvicorn.Config` that install the guards of this module."""
  protocol = type("GuardedH11", (GuardedH11Protocol,),
                  {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s})
  return {"http": protocol, "timeout_keep_alive": keep_alive_s,
          "h11_max_incomplete_event_size": max_header_bytes}
