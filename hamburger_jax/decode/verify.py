"""Verified decoding (spec §9): the base checks the micro decoder's drafts in its next forward.

Every loop iteration feeds each row's pending input, its last committed token x and its drafts
d1..dk, to the base as S separate inputs (one KV slot and one RoPE position each, [B, S], padded),
accepts the longest prefix of drafts the base agrees with, commits those drafts plus one token of
the base's own, and drafts the next group from the features at the last accepted position. The
committed tokens are the base's own: its greedy tokens exactly, or (sampling) distributed as its
samples (Leviathan et al. 2023, Chen et al. 2023). Rejected drafts' KV slots are overwritten by
the next forward, which starts at the slot after the last committed token. With
engine.draft_branches c > 1 the micro decoder drafts c chains and the base checks them as one
tree (`draft_tree`: 1 + c (S - 1) inputs, each seeing its ancestors), committing the deepest
accepted path.

The loop state is `DecodeState` with these meanings:
  group_tokens [B, S]  the pending input [x, d1, .., dk], zero-padded; group_len [B] = 1 + k
  slot, position [B]   x's KV slot and RoPE position (equal offsets: nothing is merged)
  out_group [B, N]     the forward that committed each token (a "group" = one forward's tokens)
  draft_hidden [B, S, D] the micro decoder's outputs for d1..dk (their distributions q, sampling)
  draft_counts [B, 2, S] per draft index: drafts reached (proposed, every earlier one
                       accepted), drafts accepted
  draft_accept [B, S]  the estimate that draft j is accepted given drafts < j: the stop head's,
                       or its calibrated probability (with `draft_width_rule` a step drafts and
                       sends only the drafts worth their width, `draft_width`)
  branch_tokens [B, c-1, S], branch_len [B, c-1]  a draft tree's other chains (c > 1)
  history [B, L]       each row's committed tokens by KV slot, with engine.lookup_drafts: rows
                       whose last tokens repeat an earlier stretch draft its continuation
                       (`lookup_drafts`) instead of the micro decoder's drafts
  drafts_looked_up [B] the pending drafts were looked up: a sampled row checks them as drafts
                       of a one-hot q

The acceptance rules themselves (greedy agreement, Leviathan/Chen) are `acceptance`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hamburger_jax.decode import draft_width, lookup_drafts, micro
from hamburger_jax.decode.acceptance import (accept_greedy, accept_sampled, draft_probs,
                                             per_position, processed_probs)
from hamburger_jax.decode.draft_tree import DraftTree, forward_inputs, take_entries, take_path
from hamburger_jax.decode import state as ds
from hamburger_jax.decode.models import write_entries

# Knobs of verified decoding when none are given: draft up to S - 1 tokens every step (the
# acceptance, not the stop head, decides what counts); a checkpoint's recommended knobs are
# chosen for merged decoding and do not apply here.
DEFAULT_KNOBS = {"confidence": 0.001, "min_token_prob": 0.0}

def init_extras(state: ds.DecodeState, engine, prefix=None, last=None,
                lengths=None) -> ds.DecodeState:
  """The verify-mode fields of a freshly prefilled state (no drafts pending); with
  engine.lookup_drafts the rows' token history from the prefill's prefix [B, P], last [B] and
  lengths [B] (`lookup_drafts.initial`; empty rows without them)."""
  b, s = state.group_tokens.shape
  k = engine.draft_branches
  state = state.replace(
      draft_hidden=jnp.zeros((b, s, engine.model.llama.hidden_size), jnp.float32),
      draft_counts=jnp.zeros((b, 2, s), jnp.int32), draft_accept=jnp.ones((b, s), jnp.float32))
  if draft_width.enabled(engine):
    state = state.replace(width_costs=tuple(
        jnp.float32(c) for c in draft_width.costs(b, forward_widths(s))))
  if engine.lookup_drafts:
    state = state.replace(history=(
        jnp.zeros((b, engine.cache_length), jnp.int32) if prefix is None
        else lookup_drafts.initial(engine.cache_length, prefix, last, lengths)),
        drafts_looked_up=jnp.zeros((b,), bool))
  if k == 1:
    return state
  return state.replace(branch_tokens=jnp.zeros((b, k - 1, s), jnp.int32),
                       branch_len=jnp.ones((b, k - 1), jnp.int32))


# --- drafting ------------------------------------------------------------------------------------

def draft_after(engine, params, feats, first, st: ds.DecodeState, keys, running, end):
  """Drafts the tokens after `first` [B] (committed at KV slot end [B]: the base's token
  predicted from feats [B, F, D]) -> (pending [B, S] = [first, d1..dk], 1 + k [B], micro outputs [B, S, D], each
  draft's acceptance estimate given the ones before [B, S]: the stop head's continue-probability
  before it, or with a calibrated width rule its own calibrated probability; with
  engine.draft_branches c > 1 also the other chains [B, c - 1, S] and their lengths [B, c - 1],
  else None, None; with engine.lookup_drafts the rows whose drafts were
  looked up [B], else None).

  The micro decoder runs with `first` as its step-0 token (its prefill over the features and
  draft 1 in one pass, then one pass per further draft). A row drafts on while the stop head's
  continue-probability is >= its confidence (and within max_group and its token budget, up to an
  EOS / stop id), as a merged group would grow. Greedy rows drop a draft below min_token_prob (and
  end there); sampling rows propose every draft they draw, so that each is drawn from the
  distribution the acceptance rule divides by. A draft tree's chain c > 0 starts from the c-th
  most probable first draft (greedy rows only; `draft_tree`): the micro decoder then runs on
  c x B rows, chain-major. With engine.lookup_drafts, rows whose tokens through slot end [B]
  repeat an earlier stretch draft its continuation instead, without the micro decoder
  (`lookup_drafts`; a sampled row's looked-up drafts are checked as drafts of a one-hot q).
  """
  model, s, c = engine.model, engine.max_steps, engine.draft_branches
  b = first.shape[0]
  knobs = st.knobs
  knobs = knobs.replace(min_token_prob=jnp.where(knobs.sampling.temperature > 0.0, 0.0,
                                                 knobs.min_token_prob))
  # The next forward commits at most what the budget and, as the base would, the buffer allow:
  # its new slot end + committed stays within the base's L (the engine's less the spare slots).
  room = engine.cache_length - forward_inputs(s, c) + 1 - end
  budget = jnp.minimum(knobs.max_new_tokens - st.num_out, room)
  cap = jnp.minimum(knobs.max_group, s)
  is_end = (jnp.any(first[:, None] == knobs.eos_ids, axis=-1)
            | jnp.any(first[:, None] == knobs.stop_ids, axis=-1))
  first_accept = micro.continue_probability(model.stop_logits(params, feats[:, -1]))
  may_draft = running & (knobs.min_token_prob < 1.0) & (1 < cap) & (1 < budget) & ~is_end
  go_on = may_draft & (first_accept >= knobs.confidence)
  looked = use = None
  if engine.lookup_drafts:
    looked = lookup_drafts.propose(st.history, end, engine.lookup_drafts, s - 1)
    use = may_draft & looked[2]
    go_on = go_on & ~use
  reach = jnp.minimum(cap, budget) - 1                  # the drafts a row may have
  worth = _drafting_rule(engine, st.width_costs, b, running, reach,
                         None if use is None else (use, looked[1]))
  tile = lambda x: x if c == 1 else jnp.concatenate([x] * c, axis=0)
  rank = None
  if c > 1:
    rank = (jnp.repeat(jnp.arange(c, dtype=jnp.int32), b), c)
    go_on = tile(go_on) & ((rank[0] == 0) | tile(knobs.sampling.temperature <= 0.0))
    knobs, budget, keys = jax.tree_util.tree_map(tile, (knobs, budget, keys))
  r = b * c
  tokens = jnp.zeros((r, s), jnp.int32).at[:, 0].set(tile(first))
  hidden = jnp.zeros((r, s, model.llama.hidden_size), jnp.float32)
  calib = draft_width.calibration(engine)
  # The estimates known before draft 1: the stop head's, or none yet (the calibrated estimate of
  # a draft is known once it is drafted; until then a draft counts as the last one known).
  accept = jnp.ones((r, s), jnp.float32)
  if calib is None:
    accept = accept.at[:, 1].set(tile(first_accept))
  length = jnp.ones((r,), jnp.int32)

  def keep(j, out, active, drafted, rank=None):
    tokens, hidden, accept, length = drafted
    p = micro.pick(engine, params, out, j, keys, knobs, budget, draft=True, rank=rank)
    take = active & p.keep
    tokens = tokens.at[:, j].set(jnp.where(take, p.token, tokens[:, j]))
    hidden = hidden.at[:, j].set(jnp.where(take[:, None], out.astype(jnp.float32), hidden[:, j]))
    if calib is None:
      accept = accept.at[:, j + 1].set(micro.continue_probability(p.stop), mode="drop")
    else:
      estimate = draft_width.calibrated(j, p.logprob, calib)
      accept = accept.at[:, j].set(estimate).at[:, j + 1].set(estimate, mode="drop")
    return take & p.go_on, p.token, (tokens, hidden, accept, length + take)

  def body(c):
    j, active, prev, cache, drafted = c
    out, cache = model.micro_step(params, prev, j, cache)
    active, prev, drafted = keep(j, out, active, drafted)
    return j + 1, active, prev, cache, drafted

  def drafts(drafted):
    out, cache = model.micro_prefill_step(params, feats, first)       # draft 1 in the same pass
    out, cache = jax.tree_util.tree_map(tile, (out, cache))
    active, prev, drafted = keep(1, out, go_on, drafted, rank)
    carry = (jnp.int32(2), active, prev, cache, drafted)
    more = lambda c: ((c[0] < s) & jnp.any(c[1])
                      & worth(c[0], c[4][2], jnp.where(c[1], -1, c[4][3] - 1)))
    return jax.lax.while_loop(more, body, carry)[4]

  drafted = (tokens, hidden, accept, length)
  go_on = go_on & worth(1, accept, jnp.where(go_on, -1, 0))
  tokens, hidden, accept, length = jax.lax.cond(jnp.any(go_on), drafts, lambda d: d, drafted)
  if looked is not None:
    count = jnp.minimum(looked[1], reach)
    tokens, length, accept = lookup_drafts.take(use, looked[0], count, tokens, length, accept)
    use = use & (count > 0)
  if c == 1:
    return tokens, length, hidden, accept, None, None, use
  others = lambda x: x[b:].reshape((c - 1, b) + x.shape[1:]).swapaxes(0, 1)
  return (tokens[:b], length[:b], hidden[:b], accept[:b], others(tokens), others(length), None)


def _drafting_rule(engine, width_costs, b, running, reach, looked):
  """With the width rule (`draft_width`; width_costs: the state's), worth(j, accept [B, S],
  drafted [B]) -> whether to draft index j for the batch: the rule would send a draft there were
  the rows' later estimates their last known one. drafted: the drafts a row has and ends with
  (-1: still drafting, up to reach [B]); looked = (rows with looked-up drafts [B], their count
  [B]) or None: those are sent as they are, estimated 1. Without the rule: always."""
  if not draft_width.enabled(engine):
    return lambda j, accept, drafted: jnp.bool_(True)
  widths = forward_widths(engine.max_steps)
  costs = jnp.stack(width_costs)
  fixed, count = looked if looked is not None else (jnp.zeros((b,), bool), None)

  def worth(j, accept, drafted):
    caps = jnp.where(drafted < 0, reach, drafted)
    if count is not None:
      caps = jnp.where(fixed, jnp.minimum(count, reach), caps)
    accept = jnp.where(fixed[:, None], 1.0, accept)
    return draft_width.worth_drafting(j, jnp.where(running, caps, 0), accept, running, widths,
                                      costs)
  return worth


# --- one verified step ---------------------------------------------------------------------------

def forward_slots(slot, active):
  """The KV slot [B] of each row's first input: finished and free rows take the lowest running
  row's (in their own dead buffer row), so the attention reads only the KV blocks the running
  rows fill and places the new entries only from the lowest one's block on (`kv_attention`)."""
  low = jnp.min(jnp.where(active, slot, jnp.iinfo(slot.dtype).max))
  return jnp.where(active, slot, jnp.where(jnp.any(active), low, 0))


def forward_widths(max_steps: int) -> tuple[int, ...]:
  """The static widths a verify forward runs at: 1, 2, 4, .. up to S (the batch's longest
  pending input picks the smallest that holds it, so a step without drafts costs a plain one)."""
  return tuple(sorted({min(1 << i, max_steps) for i in range(max_steps.bit_length())}
                      | {max_steps}))


def _check_width(engine, params, width: int, st: ds.DecodeState, pending, num_drafts, active,
                 keys):
  """The base forward of pending[:, :width] (one slot and position each) and the acceptance of
  its drafts, all at this static width, so that nothing vocabulary-sized runs on padding ->
  (features at the last accepted input [B, F, D], the new KV entries zero-padded to S inputs
  (`models.write_entries`; the cache is only read here: XLA would copy every buffer a switch
  branch updates), accepted [B], next token [B], accepted flags [B, S-1], committed tokens
  [B, S] and their log-probs and logits [B, S] f32)."""
  model, s = engine.model, engine.max_steps
  b = pending.shape[0]
  pending = pending[:, :width]
  positions = st.position[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
  features, entries = model.forward_unmerged(params, pending, positions, st.cache,
                                             forward_slots(st.slot, active))
  logits = model.heads(params, features[:, :, -1].reshape(b * width, -1))[0]
  logits = logits.reshape(b, width, -1).astype(jnp.float32)
  sampling = st.knobs.sampling

  def greedy():
    return accept_greedy(logits, pending, num_drafts)

  def sampled():
    p = per_position(processed_probs, logits, sampling)
    q = draft_probs(model, params, st.draft_hidden[:, :width], sampling)
    return accept_sampled(p, q, pending, num_drafts, keys, st.drafts_looked_up)

  accepted, nxt, flags = jax.lax.cond(jnp.all(sampling.temperature <= 0.0), greedy, sampled)
  pad = lambda x: jnp.pad(x, [(0, 0), (0, s - width)] + [(0, 0)] * (x.ndim - 2))
  feats = features[jnp.arange(b), accepted]
  return (feats, jax.tree_util.tree_map(pad, entries), accepted, nxt, pad(flags),
          *map(pad, _outputs(logits, pending, accepted, nxt)))


def _outputs(logits, pending, accepted, nxt):
  """The committed tokens [B, W] of a chain's inputs pending [B, W] and the base's logits after
  them [B, W, V] -> (tokens, their log-probs, their logits), each [B, W]."""
  tokens = _committed(pending, accepted, nxt)
  tok_logit = jnp.take_along_axis(logits, tokens[..., None], axis=2)[..., 0]
  # log_softmax's arithmetic at the picked entries only (no [B, W, V] log-probs written out).
  top = jnp.max(logits, axis=-1)
  log_norm = jnp.log(jnp.sum(jnp.exp(logits - top[..., None]), axis=-1))
  return tokens, (tok_logit - top) - log_norm, tok_logit


def _check_tree(engine, params, tree: DraftTree, nodes, proposed, st: ds.DecodeState, pending,
                num_drafts, active, keys):
  """`_check_width` for a draft tree: the base forward of its N nodes [B, N] (proposed [B, N])
  at once, each seeing its ancestors; greedy rows commit the deepest accepted path, sampled
  rows check chain 0 (`pending`, num_drafts [B]) by the Leviathan/Chen rule. The outputs are
  those of a chain along the committed path."""
  model, s = engine.model, engine.max_steps
  b = nodes.shape[0]
  positions = st.position[:, None] + jnp.asarray(tree.depth)[None, :]
  features, entries = model.forward_unmerged(params, nodes, positions, st.cache,
                                             forward_slots(st.slot, active), tree.mask)
  logits = model.heads(params, features[:, :, -1].reshape(b * tree.size, -1))[0]
  logits = logits.reshape(b, tree.size, -1).astype(jnp.float32)
  sampling = st.knobs.sampling
  chain = jnp.asarray(tree.chain_path(0))

  def sampled():
    p = per_position(processed_probs, logits[:, chain], sampling)
    q = draft_probs(model, params, st.draft_hidden, sampling)
    accepted, nxt, _ = accept_sampled(p, q, pending, num_drafts, keys)
    return chain[accepted], accepted, nxt

  greedy = lambda: tree.accept_greedy(logits, nodes, proposed)
  best, accepted, nxt = jax.lax.cond(jnp.all(sampling.temperature <= 0.0), greedy, sampled)
  path = tree.path(best)
  flags = jnp.arange(1, s)[None, :] <= accepted[:, None]
  feats = features[jnp.arange(b), best]
  return (feats, take_entries(entries, path), accepted, nxt, flags,
          *_outputs(take_path(logits, path), take_path(nodes, path), accepted, nxt))


def _committed(pending, accepted, nxt):
  """[B, S]: the accepted drafts d1..da, then the base's token, zero-padded (length a + 1)."""
  s = pending.shape[1]
  cols = jnp.arange(s)[None, :]
  shifted = jnp.concatenate([pending[:, 1:], jnp.zeros_like(pending[:, :1])], axis=1)
  return jnp.where(cols < accepted[:, None], shifted,
                   jnp.where(cols == accepted[:, None], nxt[:, None], 0))


def _cut(tokens, length, knobs: ds.DecodeKnobs, budget):
  """Ends the committed tokens [B, S] at the first EOS / stop id and at the row's budget [B] ->
  (length [B], hit EOS [B], hit stop id [B])."""
  s = tokens.shape[1]
  cols = jnp.arange(s)[None, :]
  inside = cols < length[:, None]
  eos = inside & jnp.any(tokens[..., None] == knobs.eos_ids[:, None, :], axis=-1)
  stop = inside & jnp.any(tokens[..., None] == knobs.stop_ids[:, None, :], axis=-1)
  ends = eos | stop
  first = jnp.where(jnp.any(ends, axis=1), jnp.argmax(ends, axis=1) + 1, length)
  cut = jnp.minimum(first, jnp.maximum(budget, 0))
  at = jnp.maximum(cut - 1, 0)[:, None]
  hit_eos = jnp.take_along_axis(eos, at, axis=1)[:, 0] & (cut == first)
  hit_stop = jnp.take_along_axis(stop, at, axis=1)[:, 0] & (cut == first)
  return cut.astype(jnp.int32), hit_eos & (cut > 0), hit_stop & (cut > 0)


def verify_step(engine, params, st: ds.DecodeState) -> ds.DecodeState:
  """Feed [x, drafts], accept, commit, draft again, update per-row bookkeeping."""
  s = engine.max_steps
  b = st.group_tokens.shape[0]
  active = ~st.done
  pending, num_drafts = st.group_tokens, jnp.where(active, st.group_len - 1, 0)
  keys = jax.vmap(jax.random.fold_in)(st.rng, st.macro_steps)
  if engine.draft_branches > 1:    # x alone at width 1, else the whole tree
    tree = DraftTree(engine.draft_branches, s)
    lengths = jnp.concatenate([st.group_len[:, None], st.branch_len], axis=1)
    lengths = jnp.where(active[:, None], lengths, 1)
    nodes, proposed = tree.inputs(
        jnp.concatenate([st.group_tokens[:, None], st.branch_tokens], axis=1), lengths)
    branches = [functools.partial(_check_width, engine, params, 1),
                functools.partial(_check_tree, engine, params, tree, nodes, proposed)]
    width = (jnp.max(lengths) > 1).astype(jnp.int32)
    reach = jnp.max(lengths, axis=1) - 1              # the deepest draft any chain proposed
  else:
    widths = forward_widths(s)
    if draft_width.enabled(engine):
      num_drafts = draft_width.choose(num_drafts, st.draft_accept, active, widths,
                                      jnp.stack(st.width_costs))
    width = jnp.sum(jnp.asarray(widths) < 1 + jnp.max(num_drafts))   # the smallest that holds all
    branches = [functools.partial(_check_width, engine, params, w) for w in widths]
    reach = num_drafts
  feats, entries, accepted, nxt, flags, tokens, tok_logprob, tok_logit = jax.lax.switch(
      width, branches, st, pending, num_drafts, active, keys)
  cache = write_entries(st.cache, entries, forward_slots(st.slot, active))
  budget = st.knobs.max_new_tokens - st.num_out
  length, hit_eos, hit_stop = _cut(tokens, accepted + 1, st.knobs, budget)
  length = jnp.where(active, length, 0)

  num_out = st.num_out + length
  draft_st = st.replace(num_out=num_out)
  if st.history is not None:
    draft_st = draft_st.replace(history=lookup_drafts.record(st.history, st.slot, tokens, length))
  next_tokens, next_len, hidden, accept, other_tokens, other_len, looked_up = draft_after(
      engine, params, feats, nxt, draft_st, keys, active & ~hit_eos & ~hit_stop, st.slot + length)

  write = lambda buf, values: ds.masked_set(buf, st.num_out - st.out_start, values, length)
  group_ids = jnp.broadcast_to(st.macro_steps[:, None], tokens.shape)
  hit_len = active & (num_out >= st.knobs.max_new_tokens)
  slot = st.slot + length
  full = active & (slot + forward_inputs(s, engine.draft_branches) > engine.cache_length)
  hit_eos, hit_stop = active & hit_eos, active & hit_stop
  reason = jnp.select([hit_eos, hit_stop, hit_len, full],
                      [ds.EOS, ds.STOP, ds.LENGTH, ds.BUFFER_FULL], ds.RUNNING)
  # Per draft index: reached (proposed, every earlier draft accepted) and accepted.
  earlier = jnp.concatenate([jnp.ones((b, 1), bool), flags[:, :-1]], axis=1)
  reached = (jnp.arange(1, s)[None, :] <= reach[:, None]) & earlier
  counts = (st.draft_counts.at[:, 0, 1:].add(reached.astype(jnp.int32))
            .at[:, 1, 1:].add(flags.astype(jnp.int32)))
  keep = lambda new, old: jnp.where(active.reshape((b,) + (1,) * (new.ndim - 1)), new, old)
  if other_tokens is not None:
    st = st.replace(branch_tokens=keep(other_tokens, st.branch_tokens),
                    branch_len=keep(other_len, st.branch_len))
  if looked_up is not None:
    st = st.replace(drafts_looked_up=keep(looked_up, st.drafts_looked_up))
  return st.replace(
      cache=cache, slot=slot, position=st.position + length, history=draft_st.history,
      group_tokens=keep(next_tokens, st.group_tokens), group_len=keep(next_len, st.group_len),
      draft_hidden=keep(hidden, st.draft_hidden), draft_counts=counts,
      draft_accept=keep(accept, st.draft_accept),
      out_tokens=write(st.out_tokens, tokens), out_group=write(st.out_group, group_ids),
      out_logprob=write(st.out_logprob, tok_logprob), out_logit=write(st.out_logit, tok_logit),
      out_stop=write(st.out_stop, jnp.zeros_like(tok_logit)), num_out=num_out,
      macro_steps=st.macro_steps + active, done=st.done | hit_eos | hit_stop | hit_len | full,
      finish=jnp.where(active, reason, st.finish).astype(jnp.int32), iteration=st.iteration + 1)
