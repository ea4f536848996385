"""Batched HAMburger and plain base-model decoding (the host side of `decode/loop.py`).

    sampler = Sampler(cfg, params, cache_length=1024)            # HamburgerConfig or LlamaConfig
    result = sampler.decode([[1, 5, 7], [1, 9]], max_new_tokens=64, confidence=0.8)
    result.tokens, result.group_sizes, result.finish_reasons, result.stats()

Prompts are validated and padded to power-of-two buckets (batch rows and prefill length), then
one prefill and ONE jitted `lax.while_loop` over macro steps run on the device. Knobs
(confidence, min_token_prob, max_new_tokens, max_group, EOS ids, temperature / top-k / top-p, the seed) are
traced: changing them never recompiles.
"""

from __future__ import annotations

import time
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.decode import draft_width
from hamburger_jax.decode import loop as lp
from hamburger_jax.decode import lookup_drafts as lookup_lib
from hamburger_jax.decode import mesh as mesh_lib
from hamburger_jax.decode import prompts as prompts_lib
from hamburger_jax.decode import state as ds
from hamburger_jax.decode import verify as verify_lib
from hamburger_jax.decode import width_costs as width_costs_lib
from hamburger_jax.decode.compile_cache import Executables, next_pow2
from hamburger_jax.decode.draft_tree import check_branches, forward_inputs
from hamburger_jax.decode.prompts import DecodeInputError
from hamburger_jax.decode.loop import TRACE_COUNTS, continue_probability  # noqa: F401
from hamburger_jax.decode.models import engine_model
from hamburger_jax.decode.sampling import SamplingParams
from hamburger_jax.decode.state import DecodeResult
from hamburger_jax.model import cpu_dots as cpu_dots_lib
from hamburger_jax.model import kv_cache as kv_cache_lib
from hamburger_jax.model import quantize as quantize_lib


class Sampler:
  """Batched HAMburger (or plain base-model) decoding with compiled-once loops.

  cfg/params: a HamburgerConfig with HAMburger params, or a LlamaConfig with Llama params. With
  `base=True` a HAMburger model decodes with its base model only (params["base"]).
  cache_length (L) and out_length (N, default L) are the static buffer sizes; eos_ids defaults
  to the config's (a decode call may pass its own). Batch rows and the prefill length are padded
  to power-of-two buckets (prefill at least `min_prompt_bucket`, at most L). Compiled functions
  are kept per sampler. The loop donates its state (KV buffers updated in place, not copied).
  compact_micro_steps: the micro prefill and micro steps run on the rows that continue their
  group, gathered into a smaller row bucket (`compaction.micro_buckets`; the same numbers per
  row; off by default).
  skip_unmerged: a forward with no merged input skips the embedder's merge and the merge
  adapter (the same numbers; `compaction.skips_unmerged`, None: on CPU).
  draft_vocab: token ids [K] that drafts choose from (`decode/draft_vocab.py`); None: all.
  verify: verified decoding (`decode/verify.py`): the base checks the micro decoder's drafts in
  its next forward, so the answer is the base's own (greedy: token for token). A HAMburger model
  only; the KV buffer gets S - 1 spare slots (a forward writes S) so it holds as many tokens.
  verify_steps: S of verified decoding, the tokens a forward commits at most (S - 1 drafts;
  `models.verify_depth`); None: the model's max_steps.
  draft_width_rule: a verified step sends only the drafts worth its forward width's cost
  (`decode/draft_width.py`); None: off; True: by the stop head's estimates; (slope, intercept)
  pairs (`Decodable.draft_width_rule`, a checkpoint's calibration): by calibrated draft
  probabilities.
  draft_width_costs: what the width rule takes a verified step at each forward width to cost,
  relative to the narrowest: None: `draft_width.costs` (a CPU's table; 1 elsewhere); "measure":
  timed on this machine once per batch bucket, with the compiled loop and the call's prompts
  (`decode/width_costs.py`; `measured_width_costs`); or one number per width. Traced: costs
  never recompile.
  draft_branches: verified decoding drafts this many chains after each committed token, the
  c-th from the c-th most probable first draft, and the base checks them as one tree
  (`decode/draft_tree.py`; greedy rows; a forward of 1 + c (S - 1) inputs); 1: one chain.
  mesh: a jax Mesh (`decode.mesh.make_decode_mesh`) to decode on, params and KV buffers sharded
  (`decode/mesh.py`); None: one device.
  quantize: "int8" decodes with int8 weights (`model/quantize.py`, quantized once here; params
  quantized already are kept), "int8:G" with a scale per group of G inputs, "int8:Gz" with a
  zero point per group too, "micro:<mode>" the drafter alone (the micro decoder and draft rows;
  verified answers stay the base's); None or "none": the params as given.
  kv_cache: what the KV buffers store: "model" (the model's dtype) or "int8" (int8 values with a
  float32 scale per head vector, `model/kv_cache.py`: ~0.53x the bytes of bfloat16).
  cpu_dots: on a CPU, the programs' dots with YNNPACK's dot fusions off ("plain", the default: a
  verified forward of a few rows per row then costs about a plain step) or as XLA compiles them
  by default ("ynnpack"); `model/cpu_dots.py`. Other backends ignore it.
  """

  def __init__(self, cfg, params, *, base: bool = False, cache_length: int = 1024,
               out_length: int | None = None, eos_ids: Sequence[int] | None = None,
               min_prompt_bucket: int = 16, donate: bool = True,
               compact_micro_steps: bool = False,
               skip_unmerged: bool | None = None, draft_vocab=None, verify: bool = False,
               mesh=None, quantize: str | None = None, draft_width_rule=None,
               kv_cache: str = "model", verify_steps: int | None = None,
               draft_branches: int = 1, lookup_drafts: int | None = None,
               draft_width_costs=None, cpu_dots: str = cpu_dots_lib.DEFAULT):
    model, params = engine_model(cfg, params, base, draft_vocab, verify, verify_steps)
    check_kv_cache(kv_cache, model.llama)
    try:
      params = quantize_lib.apply_mode(params, model.llama, quantize)
    except ValueError as e:
      raise DecodeInputError(str(e)) from None
    if cache_length < 1:
      raise DecodeInputError(f"cache_length must be >= 1, got {cache_length}.")
    try:
      check_branches(draft_branches, verify, draft_width_rule)
      draft_width_rule = draft_width.resolve(draft_width_rule)
      cpu_dots_lib.check_mode(cpu_dots)
      lookup_drafts = lookup_lib.resolve(lookup_drafts, verify, draft_branches)
      draft_width_costs = width_costs_lib.resolve(draft_width_costs,
                                                  verify_lib.forward_widths(model.max_steps))
    except ValueError as e:
      raise DecodeInputError(str(e)) from None
    self.draft_width_costs = draft_width_costs
    self.measured_width_costs: dict[int, tuple[float, ...]] = {}   # batch bucket -> costs
    spare = forward_inputs(model.max_steps, draft_branches) - 1 if verify else 0
    self.engine = lp.DecodeEngine(model, cache_length + spare, out_length or cache_length,
                                  compact_micro_steps, skip_unmerged, verify, mesh,
                                  draft_width_rule, kv_cache, draft_branches,
                                  lookup_drafts, cpu_dots)
    self.max_prompt_len = cache_length
    llama = model.llama
    self.eos_ids = llama.eos_token_ids if eos_ids is None else tuple(int(e) for e in eos_ids)
    self.params = mesh_lib.place_params(mesh, model, params)
    self.min_prompt_bucket = min_prompt_bucket
    self.executables = Executables(
        self.engine, {"prefill": lp.prefill, "loop": lp.loop, "forward": lp.one_forward},
        {"loop": (2,)} if donate else {})
    self.compile_s = 0.0        # compile time spent by the latest decode call

  @property
  def vocab_size(self) -> int:
    return self.engine.model.llama.vocab_size

  # -- validation and padding --

  def check_prompts(self, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    if len(prompts) == 0:
      raise DecodeInputError("No prompts given.")
    return [check_prompt(p, i, self.vocab_size, self.max_prompt_len)
            for i, p in enumerate(prompts)]

  def make_knobs(self, rows: int, max_new_tokens: int, confidence: float = 0.8,
                 min_token_prob: float = 0.0, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 max_group: int | None = None, eos_ids: Sequence[int] | None = None,
                 stop_ids: Sequence[int] = (), fence_ids: Sequence[int] = ()) -> ds.DecodeKnobs:
    """Validates the runtime settings and turns them into traced arrays for `rows` rows.
    fence_ids: code-fence token ids (`Tokenizer.fence_ids`): a group ends after one, and the
    code between an opening and a closing fence decodes one token per macro step."""
    n, s = self.engine.out_length, self.engine.max_steps
    if not 1 <= max_new_tokens <= n:
      raise DecodeInputError(f"max_new_tokens must be in 1..{n} (the output buffer), got "
                             f"{max_new_tokens}.")
    check_confidence(confidence, min_token_prob)
    max_group = s if max_group is None else max_group
    if not 1 <= max_group <= s:
      raise DecodeInputError(f"max_group must be in 1..{s}, got {max_group}.")
    eos = list(self.eos_ids if eos_ids is None else eos_ids)
    check_ids("EOS", eos, ds.MAX_EOS)
    check_ids("stop", stop_ids, ds.MAX_STOP)
    check_ids("fence", fence_ids, ds.MAX_FENCE)
    return ds.DecodeKnobs.make(rows, confidence=confidence, min_token_prob=min_token_prob,
                               max_new_tokens=max_new_tokens, max_group=max_group, eos_ids=eos,
                               stop_ids=stop_ids, sampling=make_sampling(temperature, top_k, top_p),
                               fence_ids=fence_ids)

  def pad_prompts(self, prompts: list[list[int]]):
    """-> prefix [Bb, P], last [Bb], lengths [Bb], padding-row flags [Bb] (numpy)."""
    b = next_pow2(len(prompts))
    prefix, last, lengths = pad_prefixes(prompts, b, self.prompt_bucket(prompts))
    return prefix, last, lengths, np.arange(b) >= len(prompts)

  def prompt_bucket(self, prompts) -> int:
    """The prefill length P for these prompts (their longest prefix, bucketed)."""
    longest = max(len(p) for p in prompts) - 1
    return min(next_pow2(longest, self.min_prompt_bucket), self.max_prompt_len)

  # -- decoding --

  def _compiled(self, name: str, *args):
    t0 = self.executables.compile_s
    out = self.executables(name, *args)
    self.compile_s += self.executables.compile_s - t0
    return out

  def start(self, prompts, *, max_new_tokens: int, seed: int = 0, micro_policy: str = "all",
            **knob_kwargs):
    """Validates, pads and prefills -> (state, number of real rows). Row i samples with
    fold_in(PRNGKey(seed), i)."""
    prompts = self.check_prompts(prompts)
    state = self._prefill(prompts, max_new_tokens, seed, micro_policy, knob_kwargs)
    costs = self.width_costs(prompts)
    if costs is not None:
      state = state.replace(width_costs=width_costs_lib.as_state_costs(costs))
    return state, len(prompts)

  def _prefill(self, prompts, max_new_tokens, seed, micro_policy, knob_kwargs):
    prefix, last, lengths, pad = self.pad_prompts(prompts)
    knobs = self.make_knobs(len(pad), max_new_tokens, **knob_kwargs)
    keys = row_keys(np.full(len(pad), prompts_lib.check_seed(seed)), np.arange(len(pad)))
    return self._compiled("prefill", self.params, prefix, last, lengths, pad, keys, knobs,
                          parse_policy(micro_policy))

  def width_costs(self, prompts) -> tuple[float, ...] | None:
    """The width rule's costs for a batch of these (validated) prompts, timed first if
    `draft_width_costs="measure"` and not yet timed for their batch bucket; None: the rule is
    off, or the default costs (`draft_width.costs`) apply."""
    if not draft_width.enabled(self.engine) or self.draft_width_costs is None:
      return None
    if self.draft_width_costs != "measure":
      return self.draft_width_costs
    bucket = next_pow2(len(prompts))
    if bucket not in self.measured_width_costs:
      timing = dict(verify_lib.DEFAULT_KNOBS, eos_ids=())   # drafts drafted, no row ends early
      start = lambda: self._prefill(prompts, self.engine.out_length, 0, "all", timing)
      self.measured_width_costs[bucket] = width_costs_lib.measure(
          start, self.run, verify_lib.forward_widths(self.engine.max_steps))
    return self.measured_width_costs[bucket]

  def run(self, state, step_limit: int | None = None):
    """Runs the loop until all rows are done (or until `state.iteration == step_limit`)."""
    limit = jnp.int32(np.iinfo(np.int32).max if step_limit is None else step_limit)
    return self._compiled("loop", self.params, state, limit)

  def _timed_start(self, prompts, **kwargs):
    """start() with a host sync -> (state, rows, timings dict, decode-phase timer)."""
    self.compile_s = 0.0
    self.width_costs(self.check_prompts(prompts))    # timed once per bucket, outside prefill_s
    t0 = time.perf_counter()
    state, rows = self.start(prompts, **kwargs)
    jax.block_until_ready(state)
    timer = _PhaseTimer(self)
    return state, rows, timer.prefill(t0), timer

  def decode(self, prompts, *, max_new_tokens: int, seed: int = 0, **knob_kwargs) -> DecodeResult:
    """Decodes a batch of token-id prompts. Knobs: confidence, min_token_prob, temperature,
    top_k, top_p, max_group, eos_ids, stop_ids, fence_ids, micro_policy ("all" = each row as
    if alone). One host sync after prefill (for its timing) and one at the end."""
    state, rows, prefill_s, timer = self._timed_start(prompts, max_new_tokens=max_new_tokens,
                                                      seed=seed, **knob_kwargs)
    host = ds.to_host(self.run(state))
    return DecodeResult.from_state(host, rows, compile_s=self.compile_s, prefill_s=prefill_s,
                                   decode_s=timer.decode())

  def stream(self, prompts, *, max_new_tokens: int, chunk_steps: int = 4, seed: int = 0,
             **knob_kwargs) -> Iterator[DecodeResult]:
    """Yields the cumulative result every `chunk_steps` macro steps (same compiled loop, same
    output as `decode`); the last one has every row finished."""
    state, rows, prefill_s, timer = self._timed_start(prompts, max_new_tokens=max_new_tokens,
                                                      seed=seed, **knob_kwargs)
    while True:
      state = self.run(state, int(state.iteration) + chunk_steps)
      host = ds.to_host(state)
      yield DecodeResult.from_state(host, rows, compile_s=self.compile_s, prefill_s=prefill_s,
                                    decode_s=timer.decode())
      if host.done.all():
        return

  def time_forward(self, state, repeats: int = 20) -> float:
    """Seconds of one compiled base forward of the pending group at this cache size."""
    jax.block_until_ready(self._compiled("forward", self.params, state))
    t0 = time.perf_counter()
    for _ in range(repeats):
      out = self._compiled("forward", self.params, state)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / repeats


class _PhaseTimer:
  """Wall time of the prefill and of the decode phase, each minus the compiling inside it."""

  def __init__(self, sampler: Sampler):
    self.sampler, self.t1, self.compile_prefill = sampler, time.perf_counter(), sampler.compile_s

  def prefill(self, t0: float) -> float:
    return self.t1 - t0 - self.compile_prefill

  def decode(self) -> float:
    compiled = self.sampler.compile_s - self.compile_prefill
    return time.perf_counter() - self.t1 - compiled


# --- validation shared with the continuous batcher -----------------------------------------------

def check_prompt(prompt: Sequence[int], index: int, vocab_size: int, max_len: int) -> list[int]:
  """One prompt as a list of ints, or DecodeInputError naming the problem."""
  p = prompts_lib.token_ids(prompt, index)
  if not p:
    raise DecodeInputError(f"Prompt {index} is empty: give at least one token.")
  bad = [t for t in p if not 0 <= t < vocab_size]
  if bad:
    raise DecodeInputError(f"Prompt {index} has token id {bad[0]} outside the vocabulary "
                           f"(0..{vocab_size - 1}).")
  if len(p) > max_len:
    raise DecodeInputError(f"Prompt {index} has {len(p)} tokens but the KV buffer holds "
                           f"{max_len} slots: raise cache_length.")
  return p


def check_confidence(confidence: float, min_token_prob: float) -> None:
  if not 0.0 < confidence <= 1.0:
    raise DecodeInputError(f"confidence must be in (0, 1], got {confidence}.")
  if not 0.0 <= min_token_prob <= 1.0:
    raise DecodeInputError(f"min_token_prob must be in [0, 1] (0 = off), got {min_token_prob}.")


def check_ids(name: str, ids: Sequence[int], limit: int) -> None:
  if len(ids) > limit:
    raise DecodeInputError(f"At most {limit} {name} ids are supported, got {len(ids)}.")


def check_kv_cache(kv_cache: str, llama) -> None:
  try:
    kv_cache_lib.check_kv_dtype(kv_cache, llama)
  except ValueError as e:
    raise DecodeInputError(str(e)) from None


def parse_policy(spec: str) -> ds.MicroPolicy:
  try:
    return ds.MicroPolicy.parse(spec)
  except ValueError as e:
    raise DecodeInputError(str(e)) from e


def row_keys(seeds, rows):
  """[B] seeds, [B] row indices -> [B, 2] keys fold_in(PRNGKey(seed), row)."""
  fold = lambda seed, row: jax.random.fold_in(jax.random.PRNGKey(seed), row)
  return jax.vmap(fold)(jnp.asarray(seeds, jnp.uint32), jnp.asarray(rows, jnp.uint32))


def make_sampling(temperature: float, top_k: int, top_p: float) -> SamplingParams:
  try:
    return SamplingParams.make(temperature, top_k, top_p)
  except ValueError as e:
    raise DecodeInputError(str(e)) from e


def pad_prefixes(prompts: Sequence[Sequence[int]], rows: int, length: int):
  """-> prefix [rows, length] (prompts minus their last token), last [rows], lengths [rows]."""
  prefix = np.zeros((rows, length), np.int32)
  last = np.zeros((rows,), np.int32)
  lengths = np.ones((rows,), np.int32)
  for i, p in enumerate(prompts):
    prefix[i, :len(p) - 1] = p[:-1]
    last[i] = p[-1]
    lengths[i] = len(p)
  return prefix, last, lengths
