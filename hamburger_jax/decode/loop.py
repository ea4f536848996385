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
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from hamburger_jax.decode import state as ds
from hamburger_jax.decode.compaction import (bucket_index, micro_buckets, micro_prefill_rows,
                                             micro_step_rows, skips_unmerged)
from hamburger_jax.decode import verify
from hamburger_jax.decode.mesh import constrain_state
from hamburger_jax.decode.micro import (Group, Pick, continue_probability,  # noqa: F401
                                         is_fence_token, pick)
from hamburger_jax.decode.models import DecodeModel
from hamburger_jax.model import cpu_dots as cpu_dots_lib
from hamburger_jax.model.kv_cache import init_cache

# Python-side trace counters (incremented while tracing): tests use them to prove no recompiles.
TRACE_COUNTS: collections.Counter = collections.Counter()


@dataclasses.dataclass(frozen=True)
class DecodeEngine:
  """The static, hashable part of a decode loop (one compile per engine and shape bucket)."""
  model: DecodeModel
  cache_length: int   # L: KV slots per row
  out_length: int     # N: output tokens per row
  # Micro prefill and micro steps run on the continuing rows only (`compaction.micro_buckets`).
  compact_micro_steps: bool = False
  # A forward with no merged input skips the embedder's merge and the merge adapter
  # (`compaction.skips_unmerged`); None: on CPU.
  skip_unmerged: bool | None = None
  # Verified decoding (`decode/verify.py`): the base checks the drafts, answers are the base's.
  verify: bool = False
  # A jax Mesh to decode on (`decode/mesh.py`), or None: one device.
  mesh: Any = None
  # Verified steps send only the drafts worth their width's cost (`draft_width`; None: off; True:
  # the stop head's estimates; a draft_width.Calibration: calibrated draft probabilities).
  draft_width_rule: Any = None
  # What the KV buffers store (`model/kv_cache.py`): "model" (its dtype) or "int8".
  kv_cache: str = "model"
  # Verified decoding drafts this many chains, a draft tree checked in one forward
  # (`decode/draft_tree.py`); 1: one chain.
  draft_branches: int = 1
  # Verified decoding drafts a row's own earlier continuation where its last tokens repeat a
  # stretch of at least this many (`decode/lookup_drafts.py`); 0: off.
  lookup_drafts: int = 0
  # XLA's CPU code path for the programs' dots (`model/cpu_dots.py`): "plain" (the default:
  # YNNPACK's dot fusions off, dots of a few rows far cheaper than YNNPACK's) or "ynnpack"
  # (XLA's own default); other backends ignore it.
  cpu_dots: str = cpu_dots_lib.DEFAULT

  @property
  def max_steps(self) -> int:
    return self.model.max_steps


@flax.struct.dataclass
class MicroCarry:
  """The inner micro-step loop's carry."""
  step: jax.Array       # [] i32: the next micro step j
  active: jax.Array     # [B] bool: rows whose group continues
  prev: jax.Array       # [B] i32: the previous micro step's tokens
  cache: Any            # the micro decoder's KV cache (fresh every macro step)
  group: Group


def _micro_step(engine, params, prev, j, cache, keys, knobs, budget):
  """Micro step j of the rows given (prev [R] tokens, their micro cache) -> (Pick [R], cache)."""
  out, cache = engine.model.micro_step(params, prev, j, cache)
  return pick(engine, params, out, j, keys, knobs, budget, draft=True), cache


def _micro_step_rows(engine, params, c: "MicroCarry", keys, knobs, budget, rows: int):
  """One micro step on the first `rows` continuing rows (`compaction.micro_step_rows`) ->
  (Pick [B], micro cache)."""
  return micro_step_rows(functools.partial(_micro_step, engine, params), c, keys, knobs, budget,
                         rows)


def _decode_group(engine: DecodeEngine, params, features, st: ds.DecodeState, keys) -> Group:
  """features [B, F, D] -> the next group of every row (micro steps run as the policy allows)."""
  model, s = engine.model, engine.max_steps
  budget = st.knobs.max_new_tokens - st.num_out
  p0 = pick(engine, params, features[:, -1], 0, keys, st.knobs, budget)
  p0 = p0.replace(go_on=p0.go_on & ~st.in_fence)      # inside a code fence: groups of one token
  group = Group.first(p0, s)
  if s == 1:
    return group

  buckets = micro_buckets(engine, features.shape[0])

  def body(c: MicroCarry) -> MicroCarry:          # j is traced: one compiled micro step
    branches = [functools.partial(_micro_step_rows, engine, params, rows=k) for k in buckets]
    which = bucket_index(buckets, jnp.sum(c.active, dtype=jnp.int32))
    p, cache = jax.lax.switch(which, branches, c, keys, st.knobs, budget)
    return MicroCarry(c.step + 1, c.active & p.go_on, p.token, cache,
                      c.group.extend(c.step, p, c.active & p.keep))

  def micro_steps(group: Group) -> Group:         # the micro cache is fresh every macro step
    active = p0.go_on & ~st.done
    prefills = [functools.partial(micro_prefill_rows, engine, params, rows=k) for k in buckets]
    cache = jax.lax.switch(bucket_index(buckets, jnp.sum(active, dtype=jnp.int32)), prefills,
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
  cache = init_cache(llama, llama.num_layers, b, engine.cache_length, engine.kv_cache)
  groups = jnp.zeros((b, p, engine.max_steps), jnp.int32).at[..., 0].set(prefix)
  positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
  _, cache = engine.model.forward(params, groups, jnp.ones((b, p), jnp.int32), positions, cache,
                                  jnp.zeros((b,), jnp.int32), skips_unmerged(engine))
  state = ds.init_state(cache, last_tokens, lengths, done, rng, knobs, policy, engine.max_steps,
                        engine.out_length)
  if not engine.verify:
    return state
  return verify.init_extras(state, engine, prefix, last_tokens, lengths)


def loop(engine: DecodeEngine, params, state: ds.DecodeState, step_limit,
         until_a_row_ends=False) -> ds.DecodeState:
  """Runs macro steps (verified steps with engine.verify) until every row is done or `state.iteration` reaches step_limit [].

  until_a_row_ends [] bool (traced): also stop after the first macro step in which a row that
  was running at entry finishes (continuous batching refills its slot at once).
  """
  TRACE_COUNTS["loop"] += 1
  done_at_entry = state.done

  def cond(st):
    row_ended = jnp.any(st.done & ~done_at_entry)
    return (st.iteration < step_limit) & ~jnp.all(st.done) & ~(until_a_row_ends & row_ended)

  step = verify.verify_step if engine.verify else _macro_step
  # On a mesh the carry keeps the state's shardings: no resharding between macro steps.
  body = lambda st: constrain_state(engine.mesh, step(engine, params, st))
  return jax.lax.while_loop(cond, body, state)


def one_forward(engine: DecodeEngine, params, state: ds.DecodeState):
  """One base forward of the pending group (for timing the loop's overhead)."""
  TRACE_COUNTS["forward"] += 1
  return engine.model.forward(params, state.group_tokens[:, None], state.group_len[:, None],
                              state.position[:, None], state.cache, state.slot)
