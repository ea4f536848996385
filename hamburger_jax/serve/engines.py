"""Decode engines behind the server: the continuous batcher, or one request at a time.

Both have the interface of `hamburger_jax.decode.batching.ContinuousBatcher` (and take its
`Request`, return its `Event`s):

    engine = make_engine("serial", cfg, params, cache_length=256, chunk_steps=8, eos_ids=(2,))
    rid = engine.submit(Request(prompt_ids=[1, 5, 7], max_new_tokens=32))
    while engine.has_work():
      for event in engine.step():            # Event(request_id, new_tokens, finished, ...)
        ...

`SerialEngine` decodes the oldest waiting request alone with `Sampler.stream` (chunk_steps macro
steps per `step()`): the one-at-a-time baseline that continuous batching is measured against.
`ModeRouter` holds a merged-decoding engine and a verified-decoding one behind the same interface
and sends each `ModeRequest` to the one its `verify` field names.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Iterator

from hamburger_jax.decode.batching import ContinuousBatcher, Event, Request
from hamburger_jax.decode.models import prompt_scorer
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.decode.state import DecodeResult
from hamburger_jax.model import cpu_dots as cpu_dots_lib
from hamburger_jax.model.config import HamburgerConfig

ENGINES = ("continuous", "serial")


@dataclasses.dataclass
class _Running:
  request_id: int
  request: Request
  stream: Iterator[DecodeResult]
  sent: int = 0                       # tokens already returned in events


class SerialEngine:
  """One request at a time (FIFO), `chunk_steps` macro steps per `step()`.

  num_slots must be 1; micro_policy must be "all" (the sampler's only policy);
  compact_micro_steps changes nothing at one row.
  """

  def __init__(self, cfg, params, *, base: bool = False, num_slots: int = 1,
               cache_length: int = 1024, chunk_steps: int = 8, eos_ids=(),
               micro_policy: str = "all", min_prompt_bucket: int = 16,
               compact_micro_steps: bool = False, draft_vocab=None, verify: bool = False,
               mesh=None, kv_cache: str = "model", verify_steps: int | None = None,
               draft_branches: int = 1, lookup_drafts: int | None = None,
               draft_width_rule=None, draft_width_costs=None, cpu_dots: str = cpu_dots_lib.DEFAULT):
    del compact_micro_steps                  # one row: every micro step runs on it alone
    if num_slots != 1:
      raise ValueError(f"SerialEngine decodes one request at a time: num_slots must be 1, got "
                       f"{num_slots}.")
    if micro_policy != "all":
      raise ValueError(f"SerialEngine supports micro_policy 'all' only, got {micro_policy!r}.")
    if chunk_steps < 1:
      raise ValueError(f"chunk_steps must be >= 1, got {chunk_steps}.")
    llama = cfg.base if isinstance(cfg, HamburgerConfig) else cfg
    self.eos_ids = tuple(int(e) for e in eos_ids) or tuple(llama.eos_token_ids)
    self.sampler = Sampler(cfg, params, base=base, cache_length=cache_length,
                           out_length=cache_length, eos_ids=self.eos_ids,
                           min_prompt_bucket=min_prompt_bucket, draft_vocab=draft_vocab,
                           verify=verify, mesh=mesh, kv_cache=kv_cache,
                           verify_steps=verify_steps, draft_branches=draft_branches,
                           lookup_drafts=lookup_drafts, draft_width_rule=draft_width_rule,
                           draft_width_costs=draft_width_costs, cpu_dots=cpu_dots)
    self.max_prompt_len = cache_length
    self.params = self.sampler.params        # as placed on the device (ContinuousBatcher's too)
    self.scorer = prompt_scorer(self.sampler.engine.model, self.params, cache_length)
    self.chunk_steps = chunk_steps
    self._waiting: collections.OrderedDict[int, Request] = collections.OrderedDict()
    self._running: _Running | None = None
    self._next_id = 0

  def _knobs(self, r: Request) -> dict:
    return dict(confidence=r.confidence, min_token_prob=r.min_token_prob,
                temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                stop_ids=tuple(int(i) for i in r.stop_ids),
                fence_ids=tuple(int(i) for i in r.fence_ids))

  def submit(self, request: Request) -> int:
    """Validates the request (ValueError naming the problem) and queues it; -> its id."""
    self.sampler.check_prompts([request.prompt_ids])
    self.sampler.make_knobs(1, request.max_new_tokens, **self._knobs(request))
    rid, self._next_id = self._next_id, self._next_id + 1
    self._waiting[rid] = request
    return rid

  def cancel(self, request_id: int) -> None:
    """Drops a waiting or running request (no further events for it)."""
    self._waiting.pop(request_id, None)
    if self._running is not None and self._running.request_id == request_id:
      self._running.stream.close()
      self._running = None

  def has_work(self) -> bool:
    return self._running is not None or bool(self._waiting)

  def step(self) -> list[Event]:
    """Starts the oldest waiting request if none runs, then decodes chunk_steps macro steps."""
    if self._running is None:
      if not self._waiting:
        return []
      rid, r = self._waiting.popitem(last=False)
      stream = self.sampler.stream([r.prompt_ids], max_new_tokens=r.max_new_tokens,
                                   chunk_steps=self.chunk_steps, seed=r.seed, **self._knobs(r))
      self._running = _Running(rid, r, stream)
    run = self._running
    snap = next(run.stream)
    tokens, reason = snap.tokens[0], snap.finish_reasons[0]
    finished = reason != "running"
    if finished:
      run.stream.close()
      self._running = None
    event = Event(run.request_id, tokens[run.sent:], finished, reason if finished else None,
                  snap.macro_steps[0], len(tokens), snap.logprobs[0][run.sent:])
    run.sent = len(tokens)
    return [event]


def make_engine(kind: str, cfg, params, **kwargs):
  """-> an engine of `kind` ("continuous" or "serial"); kwargs as in ContinuousBatcher."""
  if kind == "serial":
    return SerialEngine(cfg, params, **dict(kwargs, num_slots=1))
  if kind != "continuous":
    raise ValueError(f"Unknown engine {kind!r}: use one of {ENGINES}.")
  return ContinuousBatcher(cfg, params, **kwargs)


@dataclasses.dataclass
class ModeRequest(Request):
  """A Request with its decoding mode: verify True = verified decoding, False = merged decoding,
  None = the router's default."""
  verify: bool | None = None


class ModeRouter:
  """Two engines (ContinuousBatcher interface) behind that interface: `merged` decodes the requests
  whose `verify` is False, `verified` those whose `verify` is True (None or a plain Request:
  `default`). Ids are the router's own, unique across both engines; `step()` steps one engine
  with work, taking turns while both have work. Prompt scores (`scorer`) are the base model's in
  either mode: the merged engine's."""

  def __init__(self, merged, verified, default: bool = False):
    self.engines = {False: merged, True: verified}
    self.default = default
    self.max_prompt_len = min(merged.max_prompt_len, verified.max_prompt_len)
    self.eos_ids, self.scorer = merged.eos_ids, merged.scorer
    self._ids: dict[int, tuple[bool, int]] = {}        # router id -> (mode, engine id)
    self._back: dict[tuple[bool, int], int] = {}       # (mode, engine id) -> router id
    self._next_id = 0
    self._turn = default                               # the mode stepped first

  def mode(self, request: Request) -> bool:
    """True when `request` is decoded verified."""
    verify = getattr(request, "verify", None)
    return self.default if verify is None else bool(verify)

  def submit(self, request: Request) -> int:
    """Queues `request` on its mode's engine (its ValueError for a bad request); -> its id."""
    mode = self.mode(request)
    engine_id = self.engines[mode].submit(request)
    rid, self._next_id = self._next_id, self._next_id + 1
    self._ids[rid], self._back[(mode, engine_id)] = (mode, engine_id), rid
    return rid

  def cancel(self, request_id: int) -> None:
    """Drops a waiting or running request on the engine that holds it."""
    entry = self._ids.pop(request_id, None)
    if entry is not None:
      del self._back[entry]
      self.engines[entry[0]].cancel(entry[1])

  def has_work(self) -> bool:
    return any(e.has_work() for e in self.engines.values())

  def step(self) -> list[Event]:
    """One step of the engine whose turn it is (of the other if that one has no work)."""
    for mode in (self._turn, not self._turn):
      if self.engines[mode].has_work():
        self._turn = not mode
        return [e for e in (self._event(mode, e) for e in self.engines[mode].step()) if e]
    return []

  def _event(self, mode: bool, event: Event) -> Event | None:
    """`event` under the router's id (None for a request no longer known)."""
    rid = self._back.get((mode, event.request_id))
    if rid is None:
      return None
    if event.finished:
      del self._ids[rid], self._back[(mode, event.request_id)]
    return dataclasses.replace(event, request_id=rid)
