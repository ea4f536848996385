"""Continuous batching: a fixed number of row slots, refilled with waiting requests as rows finish.

    batcher = ContinuousBatcher(cfg, params, num_slots=8, cache_length=1024, chunk_steps=8)
    rid = batcher.submit(Request(prompt_ids=[1, 5, 7], max_new_tokens=64, confidence=0.8))
    while batcher.has_work():
      for event in batcher.step():             # admit waiting requests, run chunk_steps macro steps
        print(event.request_id, event.new_tokens, event.finished, event.finish_reason)
    completions = batcher.generate([Request(...), ...])      # or: run to completion, in order

Each `step` prefills every waiting request that has a free slot (ONE row each, written into its
slot: KV buffers, bookkeeping and knobs), then runs `chunk_steps` macro steps of the shared
decode loop over all slots (fewer while requests wait: the chunk ends with the first macro step
in which a row finishes, so its slot is refilled at once) and returns one Event per running
request. Every per-request setting
lives in the state as a [B] array, so requests coming and going never recompile (one compile per
prompt bucket for admission, one for the loop). Greedy answers equal `Sampler.decode([prompt])`
of the same request alone under micro_policy "all". Produced tokens include the EOS or stop id
that ended the request.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.decode import draft_width
from hamburger_jax.decode import loop as lp
from hamburger_jax.decode import lookup_drafts as lookup_lib
from hamburger_jax.decode import mesh as mesh_lib
from hamburger_jax.decode import slots
from hamburger_jax.decode import state as ds
from hamburger_jax.decode import verify as verify_lib
from hamburger_jax.decode import width_costs as width_costs_lib
from hamburger_jax.decode.compile_cache import Executables, next_pow2
from hamburger_jax.decode.draft_tree import check_branches, forward_inputs
from hamburger_jax.decode.models import engine_model, prompt_scorer
from hamburger_jax.decode.prompts import check_seed
from hamburger_jax.decode.sampling import SamplingParams
from hamburger_jax.decode.sampler import (DecodeInputError, check_confidence, check_ids,
                                          check_kv_cache, check_prompt, make_sampling, pad_prefixes,
                                          parse_policy, row_keys)
from hamburger_jax.model import cpu_dots as cpu_dots_lib

# The synthetic prompt `ContinuousBatcher` times the width rule's costs on holds this many ids.
TIMING_PROMPT_TOKENS = 64


@dataclasses.dataclass
class Request:
  prompt_ids: list[int]
  max_new_tokens: int = 256
  confidence: float = 0.8
  min_token_prob: float = 0.0
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0
  stop_ids: tuple[int, ...] = ()      # extra stop ids beside the model's EOS ids
  fence_ids: tuple[int, ...] = ()     # code-fence ids: fenced code decodes one token per step


@dataclasses.dataclass
class Event:
  """What one engine step produced for one request."""
  request_id: int
  new_tokens: list[int]               # tokens produced since the previous event of this request
  finished: bool
  finish_reason: str | None           # "eos" | "length" | "stop" | "buffer_full" when finished
  macro_steps: int                    # macro steps of this request so far (= KV entries of its answer)
  tokens: int                         # tokens of this request so far
  logprobs: list[float] = dataclasses.field(default_factory=list)   # the model's, of new_tokens


@dataclasses.dataclass
class Completion:
  """A finished request, as `generate` returns it (DecodeResult's fields for one row)."""
  request_id: int
  prompt_ids: list[int]
  tokens: list[int]
  group_sizes: list[int]
  logprobs: list[float]
  finish_reason: str
  macro_steps: int

  def groups(self) -> list[list[int]]:
    """The tokens cut into macro-step groups."""
    ends = np.cumsum(self.group_sizes).tolist()
    return [self.tokens[a:b] for a, b in zip([0] + ends[:-1], ends)]


@dataclasses.dataclass
class _Running:
  """Host bookkeeping of an admitted request."""
  request_id: int
  request: Request
  tokens: list[int] = dataclasses.field(default_factory=list)
  group_ids: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)

  def completion(self, reason: str, macro_steps: int) -> Completion:
    sizes = np.bincount(self.group_ids, minlength=macro_steps).tolist()
    return Completion(self.request_id, list(self.request.prompt_ids), self.tokens, sizes,
                      self.logprobs, reason, macro_steps)


class ContinuousBatcher:
  """Continuous batching over `num_slots` rows (HAMburger, or the base alone with base=True).

  cache_length: KV slots per row (prompt + one per macro step); eos_ids: empty = the model
  config's. micro_policy: "all" (each request decodes exactly as alone), "min_rows:K" or
  "fraction:F" (see `state.MicroPolicy`). compact_micro_steps: micro steps run on the rows
  that continue, gathered into a smaller row bucket (`compaction.micro_buckets`; off by
  default). skip_unmerged: a forward with no merged input skips the embedder's merge and the
  merge adapter (`compaction.skips_unmerged`; None: on CPU).
  Prefill lengths are padded to power-of-two buckets of at least `min_prompt_bucket`.
  draft_vocab: token ids [K] that drafts choose from (`decode/draft_vocab.py`); None: all.
  verify: verified decoding (`decode/verify.py`): every answer is the base's own.
  verify_steps: its tokens per forward at most (`models.verify_depth`); None: max_steps.
  draft_width_rule: verified steps send only the drafts worth their width (`draft_width`; None:
  off; True or a calibration as Sampler's).
  draft_width_costs: the rule's cost per forward width: None: `draft_width.costs`; "measure":
  timed here once, every slot holding a synthetic prompt (`_time_width_costs`); or numbers.
  draft_branches: verified steps check a tree of this many draft chains (`draft_tree`); 1: one.
  mesh: a jax Mesh to decode on (`decode/mesh.py`: params, KV buffers and slots sharded).
  kv_cache: what the KV buffers store, "model" or "int8" (`model/kv_cache.py`).
  cpu_dots: XLA's CPU code path for the dots, "plain" (default) or "ynnpack" (`model/cpu_dots.py`).
  """

  def __init__(self, cfg, params, *, base: bool = False, num_slots: int = 8,
               cache_length: int = 1024, chunk_steps: int = 8, eos_ids=(),
               micro_policy: str = "all", min_prompt_bucket: int = 16,
               compact_micro_steps: bool = False,
               skip_unmerged: bool | None = None, draft_vocab=None, verify: bool = False,
               mesh=None, draft_width_rule=None, kv_cache: str = "model",
               verify_steps: int | None = None,
               draft_branches: int = 1, lookup_drafts: int | None = None,
               draft_width_costs=None, cpu_dots: str = cpu_dots_lib.DEFAULT):
    for name, value in (("num_slots", num_slots), ("cache_length", cache_length),
                        ("chunk_steps", chunk_steps)):
      if value < 1:
        raise DecodeInputError(f"{name} must be >= 1, got {value}.")
    model, params = engine_model(cfg, params, base, draft_vocab, verify, verify_steps)
    check_kv_cache(kv_cache, model.llama)
    try:
      check_branches(draft_branches, verify, draft_width_rule)
      draft_width_rule = draft_width.resolve(draft_width_rule)
      cpu_dots_lib.check_mode(cpu_dots)
      lookup_drafts = lookup_lib.resolve(lookup_drafts, verify, draft_branches)
      draft_width_costs = width_costs_lib.resolve(draft_width_costs,
                                                  verify_lib.forward_widths(model.max_steps))
    except ValueError as e:
      raise DecodeInputError(str(e)) from None
    # a verified forward reads its inputs at consecutive slots past the row's last
    spare = forward_inputs(model.max_steps, draft_branches) - 1 if verify else 0
    self.engine = lp.DecodeEngine(model, cache_length + spare, chunk_steps * model.max_steps,
                                  compact_micro_steps, skip_unmerged, verify, mesh,
                                  draft_width_rule, kv_cache, draft_branches,
                                  lookup_drafts, cpu_dots)
    self.params = mesh_lib.place_params(mesh, model, params)
    self.scorer = prompt_scorer(model, self.params, cache_length)   # prompts' log-probs
    self.eos_ids = tuple(int(e) for e in eos_ids) or tuple(model.llama.eos_token_ids)
    check_ids("EOS", self.eos_ids, ds.MAX_EOS)
    self.num_slots, self.chunk_steps = num_slots, chunk_steps
    self.min_prompt_bucket = min_prompt_bucket
    self.max_prompt_len = cache_length
    # The state is donated: admitting a row or running a chunk updates the KV buffers in place
    # (a copy of every slot's buffers per call otherwise, on CPU too).
    self.executables = Executables(self.engine, {"admit": slots.admit,
                                                 "chunk": slots.run_chunk},
                                   {"admit": (2,), "chunk": (2,)})
    self.state = mesh_lib.place_state(mesh, slots.empty_state(self.engine, num_slots,
                                                              parse_policy(micro_policy)))
    self._slots: list[_Running | None] = [None] * num_slots
    self._queue: collections.deque[tuple[int, Request]] = collections.deque()
    self._cancel = np.zeros((num_slots,), bool)
    self._keep: set[int] = set()
    self._completed: dict[int, Completion] = {}
    self._next_id = 0
    self.measured_width_costs: tuple[float, ...] | None = None
    if draft_width_costs is not None and draft_width.enabled(self.engine):
      if draft_width_costs == "measure":
        draft_width_costs = self.measured_width_costs = self._time_width_costs()
      self.state = self.state.replace(
          width_costs=width_costs_lib.as_state_costs(draft_width_costs))

  def _time_width_costs(self) -> tuple[float, ...]:
    """The width rule's costs timed with this batcher's compiled admit and chunk
    (`width_costs.measure`): every slot holds the same synthetic prompt of up to
    TIMING_PROMPT_TOKENS ids (fewer where the timed steps would fill the KV buffer), drafting
    freely and never ending early."""
    llama, s = self.engine.model.llama, self.engine.max_steps
    n = max(1, min(TIMING_PROMPT_TOKENS, self.max_prompt_len - (width_costs_lib.STEPS + 1) * s))
    prompt = [(7919 * i + 1) % llama.vocab_size for i in range(n)]
    prefix, last, lengths = pad_prefixes([prompt], 1, self.prompt_bucket(n))
    knobs = ds.DecodeKnobs.make(
        1, max_new_tokens=np.iinfo(np.int32).max, max_group=self.engine.max_steps, eos_ids=(),
        sampling=SamplingParams.greedy(), **verify_lib.DEFAULT_KNOBS)
    none_cancelled = np.zeros((self.num_slots,), bool)

    def start():
      state = jax.tree_util.tree_map(jnp.copy, self.state)
      for slot in range(self.num_slots):
        state = self.executables("admit", self.params, state, np.int32(slot), prefix, last,
                                 lengths, knobs, row_keys([0], [0]))
      return state

    def run(state, limit):
      steps = np.int32(limit - int(state.iteration))
      return self.executables("chunk", self.params, state, none_cancelled, steps, np.bool_(False))

    return width_costs_lib.measure(start, run, verify_lib.forward_widths(self.engine.max_steps))

  @property
  def compile_s(self) -> float:
    return self.executables.compile_s

  def set_micro_policy(self, spec: str) -> None:
    """Switches the batch-wide micro-step policy (traced: no recompile)."""
    self.state = self.state.replace(micro_policy=parse_policy(spec))

  # -- requests --

  def submit(self, request: Request) -> int:
    """Validates the request and queues it -> its id (DecodeInputError, a ValueError, if bad)."""
    rid = self._next_id
    self._check(request, rid)
    self._next_id += 1
    self._queue.append((rid, request))
    return rid

  def _check(self, r: Request, rid: int) -> None:
    check_prompt(r.prompt_ids, rid, self.engine.model.llama.vocab_size, self.max_prompt_len)
    if r.max_new_tokens < 1:
      raise DecodeInputError(f"max_new_tokens must be >= 1, got {r.max_new_tokens}.")
    check_confidence(r.confidence, r.min_token_prob)
    make_sampling(r.temperature, r.top_k, r.top_p)
    check_ids("stop", r.stop_ids, ds.MAX_STOP)
    check_ids("fence", r.fence_ids, ds.MAX_FENCE)
    check_seed(r.seed)

  def cancel(self, request_id: int) -> None:
    """Drops a waiting request or frees a running one's slot (unknown or finished ids: no-op)."""
    self._queue = collections.deque((i, r) for i, r in self._queue if i != request_id)
    for slot, running in enumerate(self._slots):
      if running is not None and running.request_id == request_id:
        self._slots[slot] = None
        self._cancel[slot] = True

  def has_work(self) -> bool:
    return bool(self._queue) or any(s is not None for s in self._slots)

  # -- the engine step --

  def step(self) -> list[Event]:
    """Admits waiting requests into free slots, runs chunk_steps macro steps (fewer if requests
    still wait and a row finishes) -> events."""
    self._admit_waiting()
    if all(s is None for s in self._slots):
      return []
    # With requests waiting, the chunk ends as soon as a row finishes: its slot is refilled at
    # the next step instead of idling until the chunk's last macro step.
    self.state = self.executables("chunk", self.params, self.state, self._cancel,
                                  np.int32(self.chunk_steps), np.bool_(bool(self._queue)))
    self._cancel[:] = False
    view = slots.chunk_view(self.state)
    return [self._collect(slot, view) for slot in range(self.num_slots)
            if self._slots[slot] is not None]

  def _admit_waiting(self) -> None:
    for slot in range(self.num_slots):
      if not self._queue:
        return
      if self._slots[slot] is None:
        rid, request = self._queue.popleft()
        self._admit(slot, rid, request)

  def _admit(self, slot: int, rid: int, r: Request) -> None:
    prompt = [int(t) for t in r.prompt_ids]
    prefix, last, lengths = pad_prefixes([prompt], 1, self.prompt_bucket(len(prompt)))
    knobs = ds.DecodeKnobs.make(
        1, confidence=r.confidence, min_token_prob=r.min_token_prob,
        max_new_tokens=min(r.max_new_tokens, np.iinfo(np.int32).max),
        max_group=self.engine.max_steps, eos_ids=self.eos_ids, stop_ids=tuple(r.stop_ids),
        fence_ids=tuple(r.fence_ids),
        sampling=make_sampling(r.temperature, r.top_k, r.top_p))
    self.state = self.executables("admit", self.params, self.state, np.int32(slot), prefix, last,
                                  lengths, knobs, row_keys([r.seed], [0]))
    self._slots[slot] = _Running(rid, r)
    self._cancel[slot] = False

  def prompt_bucket(self, prompt_len: int) -> int:
    """The prefill length of a prompt of this many tokens (one admission compile per bucket)."""
    return min(next_pow2(prompt_len - 1, self.min_prompt_bucket), self.max_prompt_len)

  def _collect(self, slot: int, view: dict) -> Event:
    """The event of the request in `slot` from the chunk's host view; frees finished slots."""
    running = self._slots[slot]
    n = int(view["num_out"][slot] - view["out_start"][slot])
    new = view["tokens"][slot, :n].tolist()
    new_logprobs = view["logprob"][slot, :n].tolist()
    running.tokens += new
    running.group_ids += view["group"][slot, :n].tolist()
    running.logprobs += new_logprobs
    finished = bool(view["done"][slot])
    reason = ds.FINISH_NAMES[int(view["finish"][slot])] if finished else None
    steps = int(view["macro_steps"][slot])
    if finished:
      self._slots[slot] = None
      if running.request_id in self._keep:
        self._keep.discard(running.request_id)
        self._completed[running.request_id] = running.completion(reason, steps)
    return Event(running.request_id, new, finished, reason, steps, len(running.tokens),
                 new_logprobs)

  # -- convenience --

  def generate(self, requests: Sequence[Request]) -> list[Completion | None]:
    """Submits the requests and steps until they are all finished -> completions in order."""
    ids = [self.submit(r) for r in requests]
    self._keep.update(ids)
    while any(i not in self._completed for i in ids) and self.has_work():
      self.step()
    return [self._completed.pop(i, None) for i in ids]       # None: cancelled meanwhile
