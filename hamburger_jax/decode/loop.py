"""The device side of decoding: prefill, one macro step, and the jitted loop over macro steps.

Static (on the hashable `DecodeEngine`): the decode model (its config), KV buffer length L,
output buffer length N; shapes give the batch bucket B and the prompt bucket P. Everything else
(knobs, prompts, the loop's step limit) is traced, so changing it never recompiles.

Each macro step feeds the pending group (first the prompt's last token) to the base model at its
KV slot, takes the features of that one position and runs the micro steps (an inner
`while_loop` that ends once no row continues), then writes the group to the output buffer.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.decode import state as ds
from hamburger_jax.decode.models import DecodeModel
from hamburger_jax.decode.sampling import sample_tokens, token_log_probs
from hamburger_jax.model.attention import init_cache

# Python-side trace counters (incremented while tracing): tests use them to prove no recompiles.
TRACE_COUNTS: collections.Counter = collections.Counter()


@dataclasses.dataclass(frozen=True)
class DecodeEngine:
  """The static, hashable part of a decode loop (one compile per engine and shape bucket)."""
  model: DecodeModel
  cache_length: int   # L: KV slots per row
  out_length: int     # N: output tokens per row
  # Micro prefill and micro steps run on the continuing rows only (see `micro_buckets`);
  # None: on CPU at batches of COMPACT_FROM rows or more.
  compact_micro_steps: bool | None = None
  # A forward with no merged input skips the embedder's merge and the merge adapter (see
  # `skips_unmerged`); None: on CPU.
  skip_unmerged: bool | None = None

  @property
  def max_steps(self) -> int:
    return self.model.max_steps


def continue_probability(stop_logits):
  """1 - sigmoid(stop_logit): a group goes on while this is >= the confidence."""
  return jax.nn.sigmoid(-stop_logits.astype(jnp.float32))


# --- one macro step -----------------------------------------------------------------------------

@flax.struct.dataclass
class Pick:
  """One micro step's choice per row, each [B]."""
  token: jax.Array
  logprob: jax.Array
  logit: jax.Array
  stop: jax.Array       # stop logit
  eos: jax.Array        # the token is an EOS id
  stop_id: jax.Array    # the token is an extra stop id
  keep: jax.Array       # the token joins the group (a draft below min_token_prob does not)
  go_on: jax.Array      # the group continues after this token


@flax.struct.dataclass
class Group:
  """The group a macro step emits: tokens/logprob/logit/stop [B, S], length [B], and whether it
  ended on an EOS id / an extra stop id, [B] each."""
  tokens: jax.Array
  logprob: jax.Array
  logit: jax.Array
  stop: jax.Array
  length: jax.Array
  eos: jax.Array
  stop_id: jax.Array

  @classmethod
  def first(cls, p: Pick, max_steps: int) -> "Group":
    col = lambda x, dtype: jnp.zeros((x.shape[0], max_steps), dtype).at[:, 0].set(x)
    return cls(col(p.token, jnp.int32), col(p.logprob, jnp.float32), col(p.logit, jnp.float32),
               col(p.stop, jnp.float32), jnp.ones(p.token.shape, jnp.int32), p.eos, p.stop_id)

  def extend(self, j, p: Pick, rows) -> "Group":
    """Appends micro step j's pick to the rows [B] bool that are still in their group."""
    put = lambda buf, x: buf.at[:, j].set(jnp.where(rows, x, buf[:, j]))
    return Group(put(self.tokens, p.token), put(self.logprob, p.logprob),
                 put(self.logit, p.logit), put(self.stop, p.stop), self.length + rows,
                 self.eos | (rows & p.eos), self.stop_id | (rows & p.stop_id))


@flax.struct.dataclass
class MicroCarry:
  """The inner micro-step loop's carry."""
  step: jax.Array       # [] i32: the next micro step j
  active: jax.Array     # [B] bool: rows whose group continues
  prev: jax.Array       # [B] i32: the previous micro step's tokens
  cache: Any            # the micro decoder's KV cache (fresh every macro step)
  group: Group


def _pick(engine, params, hidden, j, keys, knobs: ds.DecodeKnobs, budget,
          draft: bool = False) -> Pick:
  """Micro step j on hidden [B, D]: sample a token, decide whether it is kept and the group goes on.

  Step 0's token (the base model's own prediction) is always kept. A drafted token (step j >= 1)
  is kept only if the model's own (untempered) probability of it is >= min_token_prob; a draft
  below it is dropped and its group ends before it. After a kept token the group goes on while
  the stop head's continue-probability is >= the confidence (min_token_prob 1 = one token per
  macro step; 0 = the stop head alone).
  keys [B, 2]: the rows' keys of this macro step. draft: j >= 1 (a model with a draft
  vocabulary then samples from its K tokens, the probability normalised as over the whole
  vocabulary, estimated; `hamburger_jax.decode.draft_vocab`).
  """
  ids = rest = None
  if draft and engine.model.draft_size:
    logits, stop, rest = engine.model.draft_heads(params, hidden)
    ids = params["draft"]["ids"]
  else:
    logits, stop = engine.model.heads(params, hidden)
  choice = sample_tokens(logits, jax.vmap(jax.random.fold_in, (0, None))(keys, j), knobs.sampling)
  logprob = token_log_probs(logits if rest is None else jnp.concatenate([logits, rest], axis=-1),
                            choice)
  logit = jnp.take_along_axis(logits, choice[:, None], axis=-1)[:, 0]
  tok = choice if ids is None else jnp.take(ids, choice)
  is_eos = jnp.any(tok[:, None] == knobs.eos_ids, axis=-1)
  is_stop = jnp.any(tok[:, None] == knobs.stop_ids, axis=-1)
  is_fence = is_fence_token(tok, knobs)
  cap = jnp.minimum(knobs.max_group, engine.max_steps)
  keep = (j == 0) | (jnp.exp(logprob) >= knobs.min_token_prob)
  # min_token_prob 1 means no draft at all (a float32 probability can round to exactly 1).
  go_on = ((continue_probability(stop) >= knobs.confidence) & keep
           & (knobs.min_token_prob < 1.0) & (j + 1 < cap) & ~is_eos & ~is_stop & (j + 1 < budget)
           & ~is_fence)
  return Pick(tok, logprob, logit, stop, is_eos, is_stop, keep, go_on)


def is_fence_token(tokens, knobs: ds.DecodeKnobs):
  """tokens [B] -> [B] bool: the token is one of the row's code-fence ids."""
  return jnp.any(tokens[:, None] == knobs.fence_ids, axis=-1)


# On CPU, batches from this many rows compact their micro steps by default (engine's None): a
# micro step on 1 of 8 continuing rows cost 0.37x the full-batch one, on 4 of 32 0.34x (2-core
# CPU, benchmarks/batch_costs.py, docs/batching.md). Off elsewhere: on one H100 the gathers only
# added launches (docs/batching.md).
COMPACT_FROM = 8


def micro_buckets(engine: DecodeEngine, batch: int) -> tuple[int, ...]:
  """Row counts a micro step may run at, for a batch bucket of `batch` rows.

  With `compact_micro_steps` (batches of 4 rows or more; None: on CPU, from COMPACT_FROM rows)
  the rows that continue their group are gathered into the smallest bucket that holds them (the
  powers of two below the batch, and the batch), for the micro prefill and for each micro step,
  so the micro steps cost what their continuing rows cost, not what the batch costs.
  """
  compact = engine.compact_micro_steps
  if compact is None:
    compact = batch >= COMPACT_FROM and jax.default_backend() == "cpu"
  if not compact or batch < 4:
    return (batch,)
  return tuple(1 << i for i in range(batch.bit_length()) if 1 << i < batch) + (batch,)


def skips_unmerged(engine: DecodeEngine) -> bool:
  """Whether a forward with no merged input skips the embedder's merge and the merge adapter (a
  branch each, the same numbers). It spares every prefill and, at batch 1, most macro steps; a
  macro step with a merged row computes both for all rows. None: on CPU, where a macro step took
  4% less at 1 row at the shipped defaults and 3-4% less at confidence 1 at 1, 8 and 32 rows, but
  0-1% at the defaults at 8 and 32 rows, where some row is almost always merged (2-core Xeon,
  benchmarks/macro_step_costs.py); off elsewhere, where it was not measured."""
  skip = engine.skip_unmerged
  return jax.default_backend() == "cpu" if skip is None else skip


def _bucket_index(buckets, count):
  """[] i32: the index of the smallest bucket that holds `count` rows."""
  return jnp.sum(jnp.asarray(buckets) < count)


def _continuing_first(active, rows: int):
  """[rows] i32: the indices of the rows with active [B] True first (stable), then the others."""
  return jnp.argsort(~active, stable=True)[:rows]


def _micro_prefill_rows(engine, params, features, active, rows: int):
  """The micro prefill of the first `rows` rows with active [B] True (gathered), scattered into a
  zero cache of all B rows: a row that does not continue its group is never read again in this
  macro step, so its micro cache need not be computed."""
  b = features.shape[0]
  if rows == b:
    return engine.model.micro_prefill(params, features)
  idx = _continuing_first(active, rows)
  part = engine.model.micro_prefill(params, jnp.take(features, idx, axis=0))
  return jax.tree_util.tree_map(
      lambda x: jnp.zeros((b,) + x.shape[1:], x.dtype).at[idx].set(x), part)


def _micro_step_rows(engine, params, c: "MicroCarry", keys, knobs, budget, rows: int):
  """One micro step on the first `rows` continuing rows (gathered), scattered back -> (Pick [B],
  micro cache). Rows left out, or in the bucket but not continuing, are never read again in
  this macro step (their group has ended)."""
  b = c.prev.shape[0]
  if rows == b:
    out, cache = engine.model.micro_step(params, c.prev, c.step, c.cache)
    return _pick(engine, params, out, c.step, keys, knobs, budget, draft=True), cache
  idx = _continuing_first(c.active, rows)
  take = lambda x: jnp.take(x, idx, axis=0)
  out, part = engine.model.micro_step(params, take(c.prev), c.step,
                                      jax.tree_util.tree_map(take, c.cache))
  pick = _pick(engine, params, out, c.step, take(keys), jax.tree_util.tree_map(take, knobs),
               take(budget), draft=True)
  scatter = lambda full, x: full.at[idx].set(x)
  cache = jax.tree_util.tree_map(scatter, c.cache, part)
  pick = jax.tree_util.tree_map(lambda x: scatter(jnp.zeros((b,) + x.shape[1:], x.dtype), x),
                                pick)
  return pick, cache


def _decode_group(engine: DecodeEngine, params, features, st: ds.DecodeState, keys) -> Group:
  """features [B, F, D] -> the next group of every row (micro steps run as the policy allows)."""
  model, s = engine.model, engine.max_steps
  budget = st.knobs.max_new_tokens - st.num_out
  p0 = _pick(engine, params, features[:, -1], 0, keys, st.knobs, budget)
  p0 = p0.replace(go_on=p0.go_on & ~st.in_fence)      # inside a code fence: groups of one token
  group = Group.first(p0, s)
  if s == 1:
    return group

  buckets = micro_buckets(engine, features.shape[0])

  def body(c: MicroCarry) -> MicroCarry:          # j is traced: one compiled micro step
    branches = [functools.partial(_micro_step_rows, engine, params, rows=k) for k in buckets]
    which = _bucket_index(buckets, jnp.sum(c.active, dtype=jnp.int32))
    p, cache = jax.lax.switch(which, branches, c, keys, st.knobs, budget)
    return MicroCarry(c.step + 1, c.active & p.go_on, p.token, cache,
                      c.group.extend(c.step, p, c.active & p.keep))

  def micro_steps(group: Group) -> Group:         # the micro cache is fresh every macro step
    active = p0.go_on & ~st.done
    prefills = [functools.partial(_micro_prefill_rows, engine, params, rows=k) for k in buckets]
    cache = jax.lax.switch(_bucket_index(buckets, jnp.sum(active, dtype=jnp.int32)), prefills,
                           features, active)
    carry = MicroCarry(jnp.int32(1), active, p0.token, cache, group)
    cond = lambda c: (c.step < s) & st.micro_policy.allows(c.active, ~st.done)
    return jax.lax.while_loop(cond, body, carry).group

  # Skip the micro prefill too when no micro step runs (common at high confidence).
  return jax.lax.cond(st.micro_policy.allows(p0.go_on, ~st.done), micro_steps, lambda g: g,
                      group)


def _macro_step(engine: DecodeEngine, params, st: ds.DecodeState) -> ds.DecodeState:
  """Feed the pending group, decode the next group, write it, update per-row bookkeeping."""
  active = ~st.done
  # Finished and free rows write at slot 0 of their own (dead) buffer row, so the attention
  # reads only the KV blocks the running rows fill.
  features, cache = engine.model.forward(params, st.group_tokens[:, None],
                                         st.group_len[:, None], st.position[:, None], st.cache,
                                         jnp.where(active, st.slot, 0),
                                         skips_unmerged(engine))
  keys = jax.vmap(jax.random.fold_in)(st.rng, st.macro_steps)    # row-local: slot-independent
  g = _decode_group(engine, params, features[:, 0], st, keys)
  glen = jnp.where(active, g.length, 0)
  group_ids = jnp.broadcast_to(st.macro_steps[:, None], g.tokens.shape)
  write = lambda buf, values: ds.masked_set(buf, st.num_out - st.out_start, values, glen)
  num_out = st.num_out + glen
  # A fence token always ends its group, so only a group's last token can open or close a fence.
  last = jnp.take_along_axis(g.tokens, jnp.maximum(g.length - 1, 0)[:, None], axis=1)[:, 0]
  in_fence = st.in_fence ^ (active & is_fence_token(last, st.knobs))
  hit_eos, hit_stop = active & g.eos, active & g.stop_id
  hit_len = active & (num_out >= st.knobs.max_new_tokens)
  full = active & (st.slot + 1 >= engine.cache_length)
  reason = jnp.select([hit_eos, hit_stop, hit_len, full],
                      [ds.EOS, ds.STOP, ds.LENGTH, ds.BUFFER_FULL], ds.RUNNING)
  return st.replace(
      cache=cache, slot=st.slot + active, position=st.position + glen,
      group_tokens=jnp.where(active[:, None], g.tokens, st.group_tokens),
      group_len=jnp.where(active, g.length, st.group_len),
      out_tokens=write(st.out_tokens, g.tokens), out_group=write(st.out_group, group_ids),
      out_logprob=write(st.out_logprob, g.logprob), out_logit=write(st.out_logit, g.logit),
      out_stop=write(st.out_stop, g.stop), num_out=num_out,
      macro_steps=st.macro_steps + active, done=st.done | hit_eos | hit_stop | hit_len | full,
      in_fence=in_fence,
      finish=jnp.where(active, reason, st.finish).astype(jnp.int32), iteration=st.iteration + 1)


# --- the jitted entry points (engine static, everything else traced) ----------------------------

def prefill(engine: DecodeEngine, params, prefix, last_tokens, lengths, done, rng,
            knobs: ds.DecodeKnobs, policy: ds.MicroPolicy) -> ds.DecodeState:
  """prefix [B, P] (prompts minus their last token, right-padded) fills slots 0..P-1.
  rng [B, 2]: one key per row."""
  TRACE_COUNTS["prefill"] += 1
  b, p = prefix.shape
  llama = engine.model.llama
  cache = init_cache(llama, llama.num_layers, b, engine.cache_length)
  groups = jnp.zeros((b, p, engine.max_steps), jnp.int32).at[..., 0].set(prefix)
  positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
  _, cache = engine.model.forward(params, groups, jnp.ones((b, p), jnp.int32), positions, cache,
                                  jnp.zeros((b,), jnp.int32), skips_unmerged(engine))
  return ds.init_state(cache, last_tokens, lengths, done, rng, knobs, policy, engine.max_steps,
                       engine.out_length)


def loop(engine: DecodeEngine, params, state: ds.DecodeState, step_limit,
         until_a_row_ends=False) -> ds.DecodeState:
  """Runs macro steps until every row is done or `state.iteration` reaches step_limit [].

  until_a_row_ends [] bool (traced): also stop after the first macro step in which a row that
  was running at entry finishes (continuous batching refills its slot at once).
  """
  TRACE_COUNTS["loop"] += 1
  done_at_entry = state.done

  def cond(st):
    row_ended = jnp.any(st.done & ~done_at_entry)
    return (st.iteration < step_limit) & ~jnp.all(st.done) & ~(until_a_row_ends & row_ended)

  return jax.lax.while_loop(cond, functools.partial(_macro_step, engine, params), state)


def one_forward(engine: DecodeEngine, params, state: ds.DecodeState):
  """One base forward of the pending group (for timing the loop's overhead)."""
  TRACE_COUNTS["forward"] += 1
  return engine.model.forward(params, state.group_tokens[:, None], state.group_len[:, None],
                              state.position[:, None], state.cache, state.slot)


# --- compiled executables -------------------------------------------------------------------------

def signature(args) -> tuple:
  """Hashable shapes/dtypes (and tree structure) of the traced arguments: the compile key."""
  leaves, tree = jax.tree_util.tree_flatten(args)
  return (tree, tuple((np.shape(x), np.result_type(x).name) for x in leaves))


class Executables:
  """AOT-compiled functions of one engine, once per (function, argument shapes).

  functions: name -> fn(engine, *args); donate: name -> argnums donated (on accelerators the
  loop updates the KV buffers in place). `compile_s` adds up the seconds spent compiling.
  """

  def __init__(self, engine: DecodeEngine, functions: dict, donate: dict | None = None):
    self.engine, self.functions, self.donate = engine, functions, donate or {}
    self._compiled: dict[tuple, Any] = {}
    self.compile_s = 0.0

  def __call__(self, name: str, *args):
    key = (name, signature(args))
    if key not in self._compiled:
      t0 = time.perf_counter()
      fn = jax.jit(self.functions[name], static_argnums=0,
                   donate_argnums=self.donate.get(name, ()))
      self._compiled[key] = fn.lower(self.engine, *args).compile()
      self.compile_s += time.perf_counter() - t0
    return self._compiled[key](*args)


def to_host(state: ds.DecodeState) -> ds.DecodeState:
  """The state's outputs as numpy (the KV cache stays on the device)."""
  return jax.device_get(state.replace(cache=None))


def next_pow2(n: int, floor: int = 1) -> int:
  n = max(n, floor)
  return 1 << (n - 1).bit_length()
