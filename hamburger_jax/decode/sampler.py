"""HAMburger and plain base-model decoding: one jitted `lax.while_loop` over macro steps.

    sampler = Sampler(cfg, params, cache_length=1024)            # HamburgerConfig or LlamaConfig
    result = sampler.decode([[1, 5, 7], [1, 9]], max_new_tokens=64, confidence=0.8)
    result.tokens, result.group_sizes, result.finish_reasons, result.stats()

Static (part of the compile key, on the hashable `DecodeEngine`): the model config, KV buffer
length L, output buffer length N; shapes give the batch bucket and the prompt bucket.
Traced (never recompile): confidence, max_new_tokens (<= N), max_group, EOS ids, temperature /
top-k / top-p, the seed, the prompts themselves and the loop's step limit (used for streaming).

Each loop iteration feeds the pending group (first the prompt's last token) to the base model at
its KV slot, takes the features of that one position and runs the micro steps (an inner
`while_loop` that ends once no row continues), then writes the group to the output buffer.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.decode import prompts as prompts_lib
from hamburger_jax.decode import state as ds
from hamburger_jax.decode.prompts import DecodeInputError
from hamburger_jax.model.attention import init_cache
from hamburger_jax.model.config import HamburgerConfig, LlamaConfig
from hamburger_jax.decode.state import DecodeResult
from hamburger_jax.model.llama import LlamaModel
from hamburger_jax.model.hamburger import HamburgerModel
from hamburger_jax.decode.sampling import SamplingParams, sample_tokens, token_log_probs

# Python-side trace counters (incremented while tracing): tests use them to prove no recompiles.
TRACE_COUNTS: collections.Counter = collections.Counter()


@dataclasses.dataclass(frozen=True)
class DecodeEngine:
  """The static, hashable part of a decode loop (one compile per engine and shape bucket).

  cfg: a HamburgerConfig (HAMburger decoding) or a LlamaConfig (plain decoding, one token per
  macro step, no embedder or micro decoder).
  """
  cfg: HamburgerConfig | LlamaConfig
  cache_length: int   # L: KV slots per row
  out_length: int     # N: output tokens per row

  @property
  def base_only(self) -> bool:
    return isinstance(self.cfg, LlamaConfig)

  @property
  def llama(self) -> LlamaConfig:
    return self.cfg if self.base_only else self.cfg.base

  @property
  def max_steps(self) -> int:
    return 1 if self.base_only else self.cfg.max_steps


def continue_probability(stop_logits):
  """1 - sigmoid(stop_logit): a group goes on while this is >= the confidence."""
  return jax.nn.sigmoid(-stop_logits.astype(jnp.float32))


# --- model calls (cfg static, params traced) --------------------------------------------------

def _forward(engine: DecodeEngine, params, group_tokens, group_len, positions, cache, slots):
  """Groups [B, T, S] (+ lengths [B, T]) at positions [B, T] -> (features [B, T, F, D], cache)."""
  if engine.base_only:
    out = LlamaModel(engine.cfg).apply({"params": params}, group_tokens[..., 0],
                                       positions=positions, cache=cache, cache_slots=slots,
                                       return_logits=False)
    return out.hidden[:, :, None], out.cache
  out = HamburgerModel(engine.cfg).apply({"params": params}, group_tokens, group_len, positions,
                                         cache=cache, cache_slots=slots, method="base_forward")
  return out.features, out.cache


def _heads(engine: DecodeEngine, params, hidden):
  """hidden [B, D] -> (logits [B, V], stop logits [B]) in float32 (stop = 0 for base decoding)."""
  if engine.base_only:
    logits = LlamaModel(engine.cfg).apply({"params": params}, hidden, method="logits")
    return logits, jnp.zeros(hidden.shape[:1], jnp.float32)
  return HamburgerModel(engine.cfg).apply({"params": params}, hidden, method="heads")


# --- one macro step -----------------------------------------------------------------------------

def _pick(engine, params, hidden, j, key, knobs: ds.DecodeKnobs, budget):
  """Micro step j on hidden [B, D] -> (token, logprob, logit, stop, is_eos, continue), each [B]."""
  logits, stop = _heads(engine, params, hidden)
  tok = sample_tokens(logits, jax.random.fold_in(key, j), knobs.sampling)
  logprob = token_log_probs(logits, tok)
  logit = jnp.take_along_axis(logits, tok[:, None], axis=-1)[:, 0]
  is_eos = jnp.any(tok[:, None] == knobs.eos_ids[None, :], axis=-1)
  cap = jnp.minimum(knobs.max_group, engine.max_steps)
  go_on = ((continue_probability(stop) >= knobs.confidence) & (j + 1 < cap) & ~is_eos
           & (j + 1 < budget))
  return tok, logprob, logit, stop, is_eos, go_on


def _decode_group(engine, params, features, st: ds.DecodeState, key):
  """features [B, F, D] -> a group: dict of [B, S] tokens/logprob/logit/stop, len [B], eos [B]."""
  b, s = features.shape[0], engine.max_steps
  budget = st.knobs.max_new_tokens - st.num_out
  tok, logprob, logit, stop, eos, go_on = _pick(engine, params, features[:, -1], 0, key,
                                                st.knobs, budget)
  first = lambda x, dtype: jnp.zeros((b, s), dtype).at[:, 0].set(x)
  g = {"tokens": first(tok, jnp.int32), "logprob": first(logprob, jnp.float32),
       "logit": first(logit, jnp.float32), "stop": first(stop, jnp.float32),
       "len": jnp.ones((b,), jnp.int32), "eos": eos}
  if s == 1:
    return g
  model = HamburgerModel(engine.cfg)

  def cond(c):
    return (c["j"] < s) & jnp.any(c["active"])

  def body(c):                                   # j is traced: one compiled micro step
    j, active = c["j"], c["active"]
    out, cache = model.apply({"params": params}, c["prev"], j, c["cache"], method="micro_step")
    tok, logprob, logit, stop, eos, go_on = _pick(engine, params, out, j, key, st.knobs, budget)
    grp = dict(c["g"])
    for name, value in (("tokens", tok), ("logprob", logprob), ("logit", logit), ("stop", stop)):
      grp[name] = grp[name].at[:, j].set(jnp.where(active, value, grp[name][:, j]))
    grp["len"] = grp["len"] + active
    grp["eos"] = grp["eos"] | (active & eos)
    return {"j": j + 1, "active": active & go_on, "prev": tok, "cache": cache, "g": grp}

  def micro_steps(g):                            # the micro cache is fresh every macro step
    micro_cache = model.apply({"params": params}, features, method="micro_prefill")
    carry = {"j": jnp.int32(1), "active": go_on & ~st.done, "prev": tok, "cache": micro_cache,
             "g": g}
    return jax.lax.while_loop(cond, body, carry)["g"]

  # Skip the micro prefill too when every row stopped at step 0 (common at high confidence).
  return jax.lax.cond(jnp.any(go_on & ~st.done), micro_steps, lambda g: g, g)


def _macro_step(engine: DecodeEngine, params, st: ds.DecodeState) -> ds.DecodeState:
  """Feed the pending group, decode the next group, write it, update per-row bookkeeping."""
  features, cache = _forward(engine, params, st.group_tokens[:, None], st.group_len[:, None],
                             st.position[:, None], st.cache, st.slot)
  g = _decode_group(engine, params, features[:, 0], st, jax.random.fold_in(st.rng, st.iteration))
  active = ~st.done
  glen = jnp.where(active, g["len"], 0)
  group_ids = jnp.broadcast_to(st.macro_steps[:, None], g["tokens"].shape)
  write = lambda buf, values: ds.masked_set(buf, st.num_out, values, glen)
  num_out = st.num_out + glen
  hit_eos = active & g["eos"]
  hit_len = active & (num_out >= st.knobs.max_new_tokens)
  full = active & (st.slot + 1 >= engine.cache_length)
  reason = jnp.where(hit_eos, ds.EOS, jnp.where(hit_len, ds.LENGTH,
                                               jnp.where(full, ds.BUFFER_FULL, ds.RUNNING)))
  return st.replace(
      cache=cache, slot=st.slot + active, position=st.position + glen,
      group_tokens=jnp.where(active[:, None], g["tokens"], st.group_tokens),
      group_len=jnp.where(active, g["len"], st.group_len),
      out_tokens=write(st.out_tokens, g["tokens"]), out_group=write(st.out_group, group_ids),
      out_logprob=write(st.out_logprob, g["logprob"]), out_logit=write(st.out_logit, g["logit"]),
      out_stop=write(st.out_stop, g["stop"]), num_out=num_out,
      macro_steps=st.macro_steps + active, done=st.done | hit_eos | hit_len | full,
      finish=jnp.where(active, reason, st.finish).astype(jnp.int32), iteration=st.iteration + 1)


# --- the jitted entry points (engine static, everything else traced) ----------------------------

def _prefill(engine: DecodeEngine, params, prefix, last_tokens, lengths, done, rng,
             knobs: ds.DecodeKnobs) -> ds.DecodeState:
  """prefix [B, P] (prompts minus their last token, right-padded) fills slots 0..P-1."""
  TRACE_COUNTS["prefill"] += 1
  b, p = prefix.shape
  llama = engine.llama
  cache = init_cache(llama, llama.num_layers, b, engine.cache_length)
  groups = jnp.zeros((b, p, engine.max_steps), jnp.int32).at[..., 0].set(prefix)
  positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
  _, cache = _forward(engine, params, groups, jnp.ones((b, p), jnp.int32), positions, cache,
                      jnp.zeros((b,), jnp.int32))
  return ds.init_state(cache, last_tokens, lengths, done, rng, knobs, engine.max_steps,
                       engine.out_length)


def _loop(engine: DecodeEngine, params, state: ds.DecodeState, step_limit) -> ds.DecodeState:
  """Runs macro steps until every row is done or `state.iteration` reaches step_limit []."""
  TRACE_COUNTS["loop"] += 1
  cond = lambda st: (st.iteration < step_limit) & ~jnp.all(st.done)
  return jax.lax.while_loop(cond, functools.partial(_macro_step, engine, params), state)


def _one_forward(engine: DecodeEngine, params, state: ds.DecodeState):
  """One base forward of the pending group (for timing the loop's overhead)."""
  TRACE_COUNTS["forward"] += 1
  features, cache = _forward(engine, params, state.group_tokens[:, None],
                             state.group_len[:, None], state.position[:, None], state.cache,
                             state.slot)
  return features, cache


@functools.lru_cache(maxsize=None)
def _jitted(name: str, donate: bool):
  fn = {"prefill": _prefill, "loop": _loop, "forward": _one_forward}[name]
  donate_argnums = (2,) if donate and name == "loop" else ()
  return jax.jit(fn, static_argnums=0, donate_argnums=donate_argnums)


def _to_host(state: ds.DecodeState) -> ds.DecodeState:
  """The state's outputs as numpy (the KV cache stays on the device)."""
  return jax.device_get(state.replace(cache=None))


# Compiled executables, shared by every Sampler with the same engine and argument shapes.
_COMPILED: dict[tuple, Any] = {}


def _signature(args) -> tuple:
  """Hashable shapes/dtypes (and tree structure) of the traced arguments: the compile key."""
  leaves, tree = jax.tree_util.tree_flatten(args)
  return (tree, tuple((np.shape(x), np.result_type(x).name) for x in leaves))


def _next_pow2(n: int, floor: int = 1) -> int:
  n = max(n, floor)
  return 1 << (n - 1).bit_length()


# --- host side -----------------------------------------------------------------------------------

class Sampler:
  """Batched HAMburger (or plain base-model) decoding with compiled-once loops.

  cfg/params: a HamburgerConfig with HAMburger params, or a LlamaConfig with Llama params. With
  `base=True` a HAMburger model decodes with its base model only (params["base"]).
  cache_length (L) and out_length (N, default L) are the static buffer sizes; eos_ids defaults
  to the config's (a decode call may pass its own). Batch rows and the prefill length are padded
  to power-of-two buckets (prefill at least `min_prompt_bucket`, at most L). On accelerators the
  loop donates its state (the KV buffers are updated in place).
  """

  def __init__(self, cfg, params, *, base: bool = False, cache_length: int = 1024,
               out_length: int | None = None, eos_ids: Sequence[int] | None = None,
               min_prompt_bucket: int = 16, donate: bool | None = None):
    if isinstance(cfg, HamburgerConfig) and base:
      cfg, params = cfg.base, params["base"]
    llama = cfg if isinstance(cfg, LlamaConfig) else cfg.base
    if cache_length < 1:
      raise DecodeInputError(f"cache_length must be >= 1, got {cache_length}.")
    self.engine = DecodeEngine(cfg, cache_length, out_length or cache_length)
    self.eos_ids = llama.eos_token_ids if eos_ids is None else tuple(int(e) for e in eos_ids)
    self.params = jax.device_put(params)
    self.min_prompt_bucket = min_prompt_bucket
    self.donate = jax.default_backend() != "cpu" if donate is None else donate
    self.compile_s = 0.0        # compile time spent by the latest decode call

  @property
  def vocab_size(self) -> int:
    return self.engine.llama.vocab_size

  # -- compile cache: AOT-compiled once per (function, engine, argument shapes), process-wide --

  def _compiled_fn(self, name: str, *args):
    key = (name, self.engine, self.donate, _signature(args))
    if key not in _COMPILED:
      t0 = time.perf_counter()
      _COMPILED[key] = _jitted(name, self.donate).lower(self.engine, *args).compile()
      self.compile_s += time.perf_counter() - t0
    return _COMPILED[key]

  # -- validation and padding --

  def check_prompts(self, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    if len(prompts) == 0:
      raise DecodeInputError("No prompts given.")
    out = []
    for i, p in enumerate(prompts):
      p = prompts_lib.token_ids(p, i)
      if not p:
        raise DecodeInputError(f"Prompt {i} is empty: give at least one token.")
      bad = [t for t in p if not 0 <= t < self.vocab_size]
      if bad:
        raise DecodeInputError(f"Prompt {i} has token id {bad[0]} outside the vocabulary "
                               f"(0..{self.vocab_size - 1}).")
      if len(p) > self.engine.cache_length:
        raise DecodeInputError(f"Prompt {i} has {len(p)} tokens but the KV buffer holds "
                               f"{self.engine.cache_length} slots: raise cache_length.")
      out.append(p)
    return out

  def make_knobs(self, max_new_tokens: int, confidence: float = 0.8, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, max_group: int | None = None,
                 eos_ids: Sequence[int] | None = None) -> ds.DecodeKnobs:
    """Validates the runtime settings and turns them into traced arrays."""
    n, s = self.engine.out_length, self.engine.max_steps
    if not 1 <= max_new_tokens <= n:
      raise DecodeInputError(f"max_new_tokens must be in 1..{n} (the output buffer), got "
                             f"{max_new_tokens}.")
    if not 0.0 < confidence <= 1.0:
      raise DecodeInputError(f"confidence must be in (0, 1], got {confidence}.")
    max_group = s if max_group is None else max_group
    if not 1 <= max_group <= s:
      raise DecodeInputError(f"max_group must be in 1..{s}, got {max_group}.")
    eos = list(self.eos_ids if eos_ids is None else eos_ids)
    if len(eos) > ds.MAX_EOS:
      raise DecodeInputError(f"At most {ds.MAX_EOS} EOS ids are supported, got {len(eos)}.")
    try:
      sampling = SamplingParams.make(temperature, top_k, top_p)
    except ValueError as e:
      raise DecodeInputError(str(e)) from e
    eos_arr = jnp.asarray(eos + [-1] * (ds.MAX_EOS - len(eos)), jnp.int32)
    return ds.DecodeKnobs(jnp.float32(confidence), jnp.int32(max_new_tokens), jnp.int32(max_group),
                          eos_arr, sampling)

  def pad_prompts(self, prompts: list[list[int]]):
    """-> prefix [Bb, P], last [Bb], lengths [Bb], padding-row flags [Bb] (numpy)."""
    b = _next_pow2(len(prompts))
    longest = max(len(p) for p in prompts) - 1
    p_len = min(_next_pow2(longest, self.min_prompt_bucket), self.engine.cache_length)
    prefix = np.zeros((b, p_len), np.int32)
    last = np.zeros((b,), np.int32)
    lengths = np.ones((b,), np.int32)
    for i, p in enumerate(prompts):
      prefix[i, :len(p) - 1] = p[:-1]
      last[i] = p[-1]
      lengths[i] = len(p)
    return prefix, last, lengths, np.arange(b) >= len(prompts)

  # -- decoding --

  def start(self, prompts, *, max_new_tokens: int, seed: int = 0, **knob_kwargs):
    """Validates, pads and prefills -> (state, number of real rows)."""
    prompts = self.check_prompts(prompts)
    knobs = self.make_knobs(max_new_tokens, **knob_kwargs)
    prefix, last, lengths, pad = self.pad_prompts(prompts)
    key = jax.random.PRNGKey(prompts_lib.check_seed(seed))
    args = (self.params, prefix, last, lengths, pad, key, knobs)
    fn = self._compiled_fn("prefill", *args)
    return fn(*args), len(prompts)

  def run(self, state, step_limit: int | None = None):
    """Runs the loop until all rows are done (or until `state.iteration == step_limit`)."""
    limit = jnp.int32(np.iinfo(np.int32).max if step_limit is None else step_limit)
    fn = self._compiled_fn("loop", self.params, state, limit)
    return fn(self.params, state, limit)

  def decode(self, prompts, *, max_new_tokens: int, seed: int = 0, **knob_kwargs) -> DecodeResult:
    """Decodes a batch of token-id prompts. Knobs: confidence, temperature, top_k, top_p,
    max_group. One host sync after prefill (for its timing) and one at the end."""
    self.compile_s = 0.0
    t0 = time.perf_counter()
    state, rows = self.start(prompts, max_new_tokens=max_new_tokens, seed=seed, **knob_kwargs)
    jax.block_until_ready(state)
    t1 = time.perf_counter()
    prefill_s, compile_prefill = t1 - t0 - self.compile_s, self.compile_s
    state = self.run(state)
    host = _to_host(state)
    decode_s = time.perf_counter() - t1 - (self.compile_s - compile_prefill)
    return DecodeResult.from_state(host, rows, compile_s=self.compile_s, prefill_s=prefill_s,
                                   decode_s=decode_s)

  def stream(self, prompts, *, max_new_tokens: int, chunk_steps: int = 4, seed: int = 0,
             **knob_kwargs) -> Iterator[DecodeResult]:
    """Yields the cumulative result every `chunk_steps` macro steps (same compiled loop, same
    output as `decode`); the last one has every row finished."""
    self.compile_s = 0.0
    t0 = time.perf_counter()
    state, rows = self.start(prompts, max_new_tokens=max_new_tokens, seed=seed, **knob_kwargs)
    jax.block_until_ready(state)
    prefill_s = time.perf_counter() - t0 - self.compile_s
    t1, compile_prefill = time.perf_counter(), self.compile_s
    while True:
      state = self.run(state, int(state.iteration) + chunk_steps)
      host = _to_host(state)
      decode_s = time.perf_counter() - t1 - (self.compile_s - compile_prefill)
      yield DecodeResult.from_state(host, rows, compile_s=self.compile_s, prefill_s=prefill_s,
                                    decode_s=decode_s)
      if host.done.all():
        return

  def time_forward(self, state, repeats: int = 20) -> float:
    """Seconds of one compiled base forward of the pending group at this cache size."""
    fn = self._compiled_fn("forward", self.params, state)
    jax.block_until_ready(fn(self.params, state))
    t0 = time.perf_counter()
    for _ in range(repeats):
      out = fn(self.params, state)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / repeats
