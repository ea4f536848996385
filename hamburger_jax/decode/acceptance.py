"""The acceptance rules of verified decoding (spec section 9): greedy agreement and the
Leviathan/Chen rule, with the distributions they compare.

    accepted, next_token, flags = accept_greedy(logits, pending, num_drafts)
    p = per_position(processed_probs, logits, sampling)       # the base's, [B, S, V]
    q = draft_probs(model, params, draft_hidden, sampling)    # the drafts', [B, S, V | K]
    accepted, next_token, flags = accept_sampled(p, q, pending, num_drafts, keys)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hamburger_jax.decode.sampling import filter_logits, greedy_tokens

_ACCEPT_FOLD = 1 << 20      # key folds of the acceptance draws and of the bonus / residual draw
_RESIDUAL_FOLD = (1 << 20) + 1


# --- distributions ---------------------------------------------------------------------------------

def processed_probs(logits, sampling):
  """logits [R, V] -> the distribution a token is drawn from [R, V] f32: one-hot argmax for greedy
  rows (temperature <= 0), else softmax of the tempered logits after top-k / top-p. sampling: [R]."""
  logits = logits.astype(jnp.float32)
  onehot = jax.nn.one_hot(greedy_tokens(logits), logits.shape[-1], dtype=jnp.float32)
  greedy = sampling.temperature <= 0.0

  def soft():
    scaled = logits / jnp.maximum(sampling.temperature, 1e-6)[:, None]
    needs_filter = jnp.any((sampling.top_k > 0) | (sampling.top_p < 1.0))
    scaled = jax.lax.cond(needs_filter, lambda x: filter_logits(x, sampling.top_k, sampling.top_p),
                          lambda x: x, scaled)
    return jnp.where(greedy[:, None], onehot, jax.nn.softmax(scaled, axis=-1))

  return jax.lax.cond(jnp.all(greedy), lambda: onehot, soft)


def per_position(fn, x, sampling):
  """fn(x [R, ...], sampling [R]) applied to x [B, S, ...] with each row's sampling -> [B, S, ..]."""
  b, s = x.shape[:2]
  rows = jax.tree_util.tree_map(lambda v: jnp.repeat(v, s, axis=0), sampling)
  out = fn(x.reshape((b * s,) + x.shape[2:]), rows)
  return out.reshape((b, s) + out.shape[1:])


def draft_probs(model, params, hidden, sampling):
  """The distributions the drafts were drawn from, from the micro outputs hidden [B, S, D]
  (index 0 unused): q [B, S, V], or with a draft vocabulary (q_k [B, S, K], its ids [K]), q
  being zero outside those ids."""
  b, s, d = hidden.shape
  flat = hidden.reshape(b * s, d)
  if model.draft_size:
    logits, _, _ = model.draft_heads(params, flat)
    q_k = per_position(processed_probs, logits.reshape(b, s, -1), sampling)
    return q_k, params["draft"]["ids"]
  logits, _ = model.heads(params, flat)
  return per_position(processed_probs, logits.reshape(b, s, -1), sampling)


# --- acceptance ------------------------------------------------------------------------------------

def accept_greedy(logits, pending, num_drafts):
  """logits [B, S, V] (the base's after each pending input), pending [B, S], num_drafts [B] ->
  (accepted [B] i32, next token [B] i32, accepted flags [B, S-1] bool)."""
  g = greedy_tokens(logits)
  s = pending.shape[1]
  ok = (pending[:, 1:] == g[:, :-1]) & (jnp.arange(1, s)[None, :] <= num_drafts[:, None])
  flags = jnp.cumprod(ok, axis=1).astype(bool)
  accepted = jnp.sum(flags, axis=1, dtype=jnp.int32)
  return accepted, jnp.take_along_axis(g, accepted[:, None], axis=1)[:, 0], flags


def accept_sampled(p, q, pending, num_drafts, keys, fixed=None):
  """The Leviathan/Chen rule. p [B, S, V]: the base's processed distributions after each pending
  input; q: the distributions drafts 1..S-1 were drawn from (`draft_probs`: [B, S, V], or over a
  draft vocabulary (q_k [B, S, K], ids [K])); keys [B, 2]; fixed [B] bool (or None): rows whose
  drafts were chosen, not drawn (lookup drafts), so that each q_i is one-hot at d_i.
  Draft i is accepted with probability min(1, p_{i-1}(d_i) / q_i(d_i)), in order; at the first
  rejection the next token is drawn from normalise(max(p - q, 0)), else from p after the last
  draft. -> (accepted [B], next token [B], accepted flags [B, S-1])."""
  s = pending.shape[1]
  q, ids = q if isinstance(q, tuple) else (q, None)
  is_id = lambda ids: pending[:, 1:, None] == ids.astype(pending.dtype)[None, None, :]
  is_draft = is_id(jnp.arange(p.shape[-1]))
  pd = _pick(p[:, :-1], is_draft, axis=2)                                 # p_{i-1}(d_i)
  qd = _pick(q[:, 1:], is_draft if ids is None else is_id(ids), axis=2)   # q_i(d_i)
  if fixed is not None:
    qd = jnp.where(fixed[:, None], 1.0, qd)
  u = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, _ACCEPT_FOLD), (s - 1,)))(keys)
  ok = (u * qd < pd) & (jnp.arange(1, s)[None, :] <= num_drafts[:, None])
  flags = jnp.cumprod(ok, axis=1).astype(bool)
  accepted = jnp.sum(flags, axis=1, dtype=jnp.int32)
  at = lambda i: (jnp.arange(s)[None, :] == i[:, None])[:, :, None]       # [B, S, 1]
  p_a = _pick(p, at(accepted), axis=1)                                     # [B, V]
  q_next = _pick(q, at(jnp.minimum(accepted + 1, s - 1)), axis=1)         # [B, V] or [B, K]
  if ids is not None:                  # only this row is spread over the vocabulary
    q_next = jnp.zeros_like(p_a).at[:, ids].set(q_next)
  if fixed is not None:                # a rejected fixed draft: p without that token
    d_next = jnp.take_along_axis(pending, jnp.minimum(accepted + 1, s - 1)[:, None], axis=1)[:, 0]
    q_next = jnp.where(fixed[:, None], jax.nn.one_hot(d_next, p.shape[-1], dtype=p.dtype), q_next)
  residual = jnp.maximum(p_a - q_next, 0.0)
  rejected = (accepted < num_drafts)[:, None] & (jnp.sum(residual, -1, keepdims=True) > 0)
  dist = jnp.where(rejected, residual, p_a)
  draw = lambda k, w: jax.random.categorical(jax.random.fold_in(k, _RESIDUAL_FOLD), jnp.log(w))
  return accepted, jax.vmap(draw)(keys, dist).astype(jnp.int32), flags


def _pick(x, mask, axis: int):
  """The one entry of x where mask (broadcast to x) holds, along axis: a masked sum, which XLA
  fuses into one read of x (a gather from [B, S, V] made a TPU lay x out with S on the lanes,
  padded 128 / S times: docs/results/tpu.md)."""
  return jnp.sum(jnp.where(mask, x, 0.0), axis=axis)
