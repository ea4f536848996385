"""Device side of continuous batching: a fixed set of row slots that requests come and go from.

    state = empty_state(engine, num_slots)                  # every slot free (done)
    state = admit(engine, params, state, slot, prefix [1, P], last [1], length [1], knobs, key)
    state = run_chunk(engine, params, state, cancel [B], steps, refill [] bool)

`admit` prefills ONE prompt into a fresh row and writes that row (KV buffers, bookkeeping, knobs)
into `slot`; `run_chunk` runs up to `steps` macro steps of the shared loop (fewer when requests
wait and a row finishes: its slot is refilled at once). The slot, prompts, knobs, step counts
and the refill flag are traced: one compile per prompt bucket P (admit) and one for the loop.
The output buffer holds one chunk: `run_chunk` first sets out_start = num_out, so a row's tokens
of this chunk are out_tokens[b, :num_out - out_start] (N = chunk steps * S is enough).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hamburger_jax.decode import loop as lp
from hamburger_jax.decode import state as ds
from hamburger_jax.decode import verify
from hamburger_jax.decode.sampling import SamplingParams
from hamburger_jax.model.kv_cache import init_cache


def empty_state(engine: lp.DecodeEngine, num_slots: int, policy: ds.MicroPolicy) -> ds.DecodeState:
  """A state whose `num_slots` rows are all free (done, finish PADDING)."""
  llama = engine.model.llama
  cache = init_cache(llama, llama.num_layers, num_slots, engine.cache_length,
                     engine.kv_cache)
  rows = jnp.ones((num_slots,), jnp.int32)
  knobs = ds.DecodeKnobs.make(num_slots, confidence=1.0, min_token_prob=0.0, max_new_tokens=1,
                              max_group=1, eos_ids=(), sampling=SamplingParams.greedy())
  keys = jnp.zeros((num_slots, 2), jnp.uint32)
  state = ds.init_state(cache, rows * 0, rows, jnp.ones((num_slots,), bool), keys, knobs, policy,
                        engine.max_steps, engine.out_length)
  return verify.init_extras(state, engine) if engine.verify else state


def admit(engine: lp.DecodeEngine, params, state: ds.DecodeState, slot, prefix, last, length,
          knobs: ds.DecodeKnobs, key) -> ds.DecodeState:
  """Prefills one prompt (prefix [1, P], last [1], length [1]; knobs with [1] fields, key
  [1, 2]) and puts it in row `slot` [] of `state`, replacing whatever was there."""
  lp.TRACE_COUNTS["admit"] += 1
  row = lp.prefill(engine, params, prefix, last, length, jnp.zeros((1,), bool), key, knobs,
                   state.micro_policy)

  def put(big, small):
    if big.ndim == 0:                      # iteration and the policy are batch-wide
      return big
    return jax.lax.dynamic_update_slice_in_dim(big, small.astype(big.dtype), slot, axis=0)

  return jax.tree_util.tree_map(put, state, row)


def run_chunk(engine: lp.DecodeEngine, params, state: ds.DecodeState, cancel, steps,
              refill) -> ds.DecodeState:
  """Frees the rows flagged in cancel [B] bool, then runs up to `steps` [] macro steps; with
  refill [] bool (requests are waiting) it returns as soon as a running row finishes, so the
  host can admit a waiting request into that slot instead of leaving it idle."""
  lp.TRACE_COUNTS["chunk"] += 1
  free = cancel & ~state.done
  state = state.replace(done=state.done | cancel,
                        finish=jnp.where(free, ds.PADDING, state.finish).astype(jnp.int32),
                        out_start=state.num_out)
  return lp.loop(engine, params, state, state.iteration + steps, refill)


def chunk_view(state: ds.DecodeState):
  """What the host reads after a chunk (the KV cache and knobs stay on the device)."""
  return jax.device_get({
      "done": state.done, "finish": state.finish, "num_out": state.num_out,
      "out_start": state.out_start, "macro_steps": state.macro_steps, "slot": state.slot,
      "tokens": state.out_tokens, "group": state.out_group, "logprob": state.out_logprob,
      "logit": state.out_logit, "stop": state.out_stop})
