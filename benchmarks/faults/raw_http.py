"""A raw HTTP/1.1 client, one connection per request, that can misbehave on purpose.

    reply = exchange(port, head("POST", "/tokenize", 15) + b'{"prompt": "a"}', timeout=30)
    reply.status        # 200, or CLOSED (the server closed without a reply), TIMEOUT, HUNG_UP

The request bytes are sent by a writer thread while the reply is read, so a server that answers
(413) before a large body is whole is heard; `half_close` shuts the writing side once everything
is sent, `hang_up_after_s` closes the connection that long after sending, reading nothing.
Requests say "Connection: close": a reply ends when the server closes.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time

CLOSED, TIMEOUT, HUNG_UP = "closed", "timeout", "hung up"


@dataclasses.dataclass
class Reply:
  """status: the HTTP status, or CLOSED / TIMEOUT / HUNG_UP; seconds: from connect to the end."""
  status: int | str
  headers: dict[str, str]
  body: bytes
  seconds: float

  def json(self):
    """The body as JSON, or None when it is not JSON."""
    try:
      return json.loads(self.body)
    except ValueError:
      return None


def head(method: str, path: str, length: int | None = None) -> bytes:
  """A request head; with `length`, a JSON body of that many bytes follows."""
  lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
  if length is not None:
    lines += ["Content-Type: application/json", f"Content-Length: {length}"]
  return ("\r\n".join(lines) + "\r\n\r\n").encode()


def parse(data: bytes, seconds: float) -> Reply:
  """The reply in `data` (everything read); CLOSED when it holds no status line."""
  top, _, body = data.partition(b"\r\n\r\n")
  lines = top.decode("latin-1").split("\r\n")
  parts = lines[0].split(" ", 2)
  if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
    return Reply(CLOSED, {}, data, seconds)
  headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
  headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
  length = headers.get("content-length", "")
  return Reply(int(parts[1]), headers, body[:int(length)] if length.isdigit() else body, seconds)


def _send(sock: socket.socket, data: bytes, half_close: bool) -> None:
  try:
    sock.sendall(data)
    if half_close:
      sock.shutdown(socket.SHUT_WR)
  except OSError:
    pass                                    # the server answered and closed before the end


def _read(sock: socket.socket, deadline: float) -> tuple[bytes, bool]:
  """Everything until the server closes -> (data, whether the deadline passed first)."""
  chunks = []
  while True:
    left = deadline - time.monotonic()
    if left <= 0:
      return b"".join(chunks), True
    sock.settimeout(left)
    try:
      chunk = sock.recv(1 << 16)
    except socket.timeout:
      return b"".join(chunks), True
    except OSError:                          # reset: what arrived before it is the reply
      return b"".join(chunks), False
    if not chunk:
      return b"".join(chunks), False
    chunks.append(chunk)


def exchange(port: int, data: bytes, timeout: float, half_close: bool = False,
             hang_up_after_s: float | None = None,
             connected: threading.Event | None = None) -> Reply:
  """Sends `data` to 127.0.0.1:`port` and reads the reply (see the module docstring);
  `connected` is set once the connection is open."""
  t0 = time.monotonic()
  with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
    if connected is not None:
      connected.set()
    if hang_up_after_s is not None:
      _send(sock, data, False)
      time.sleep(hang_up_after_s)
      return Reply(HUNG_UP, {}, b"", time.monotonic() - t0)
    writer = threading.Thread(target=_send, args=(sock, data, half_close), daemon=True)
    writer.start()
    got, timed_out = _read(sock, t0 + timeout)
    writer.join(1.0)
  reply = parse(got, time.monotonic() - t0)
  if timed_out and reply.status == CLOSED:
    reply.status = TIMEOUT
  return reply


def get(port: int, path: str, timeout: float) -> Reply:
  """GET `path` (a TransportError-free call: a failure is a CLOSED / TIMEOUT reply)."""
  try:
    return exchange(port, head("GET", path), timeout)
  except OSError:
    return Reply(CLOSED, {}, b"", 0.0)
