"""Generated token ids -> text pieces for one request, cut at the first stop string.

    out = TextOutput(tokenizer, stops=["\\n\\n"])
    piece, stopped = out.add([17, 4], final=False)    # new printable text; True at a stop string

Text that could be the beginning of a stop string (an end of the text that a stop string starts
with), and partial UTF-8 characters, are held back until the next tokens decide them. Without a tokenizer (a token-id server) the text is the ids,
space-separated.
"""

from __future__ import annotations

from typing import Sequence


class TextOutput:
  """Accumulates one request's ids; `add` returns only text not returned before."""

  def __init__(self, tokenizer, stops: Sequence[str] = ()):
    if stops and tokenizer is None:
      raise ValueError("Stop strings need a tokenizer.")
    self.tokenizer = tokenizer
    self.stops = list(stops)
    self.ids: list[int] = []
    self.sent = 0                                  # characters returned so far
    self._hold = max((len(s) for s in self.stops), default=1) - 1

  def _render(self, final: bool) -> str:
    if self.tokenizer is None:
      return " ".join(str(i) for i in self.ids)
    text = self.tokenizer.decode(self.ids)
    if not final:
      text = text.rstrip("\ufffd")                 # an incomplete UTF-8 character so far
    return text

  def _held(self, text: str) -> int:
    """Length of the longest end of `text` that a stop string starts with."""
    for k in range(min(self._hold, len(text) - self.sent), 0, -1):
      if any(s.startswith(text[-k:]) for s in self.stops):
        return k
    return 0

  def add(self, new_ids: Sequence[int], final: bool) -> tuple[str, bool]:
    """-> (text to send, whether a stop string ended the output). After a stop, don't call."""
    self.ids.extend(int(i) for i in new_ids)
    text = self._render(final)
    hits = [i for i in (text.find(s, self.sent) for s in self.stops) if i >= 0]
    if hits:
      end, stopped = min(hits), True
    else:
      end = len(text) if final else max(self.sent, len(text) - self._held(text))
      stopped = False
    piece = text[self.sent:end]
    self.sent = max(self.sent, end)
    return piece, stopped
