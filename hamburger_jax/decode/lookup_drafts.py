"""Drafts looked up in a row's own tokens, for verified decoding (prompt lookup).

A row's committed tokens (its prompt, then its answer so far) sit in `history` [B, L], token i at
the KV slot i it was fed at (verified decoding gives every token its own slot). After each
forward the row's tokens end with some suffix; where that suffix appeared earlier in the row
(`MAX_MATCH` tokens at most, the longest match first, then its latest occurrence), the tokens
that followed it there are the next drafts, in place of the micro decoder's, when the match is
at least `min_match` tokens long. Answers repeat their prompt's names and their own phrases, so
such drafts are often right, cost no micro-decoder pass, and the base checks them as any other
draft (a sampled row as drafts of a one-hot q: each is accepted with the base's probability of
it, and a rejected one's token is drawn no more at that position).

    history = record(history, slot, tokens, length)      # after each verified forward
    drafts, count, found = propose(history, end, min_match, max_drafts)
"""

from __future__ import annotations

import jax.numpy as jnp

MAX_MATCH = 8   # suffix tokens compared at most
DEFAULT_MIN_MATCH = 2


def resolve(min_match: int | None, verify: bool, branches: int) -> int:
  """The engine's setting: min_match (None: DEFAULT_MIN_MATCH for verified decoding of one
  chain, else 0 = off); ValueError where lookup drafts cannot run."""
  if min_match is None:
    return DEFAULT_MIN_MATCH if verify and branches == 1 else 0
  if not 0 <= min_match <= MAX_MATCH:
    raise ValueError(f"lookup_drafts must be in 0..{MAX_MATCH} (0: off), got {min_match}.")
  if min_match and not verify:
    raise ValueError("lookup_drafts drafts for verified decoding: add verify (--verify) or "
                     "set it to 0.")
  if min_match and branches > 1:
    raise ValueError("lookup_drafts drafts one chain: use draft_branches 1 or lookup_drafts 0.")
  return min_match


def initial(cache_length: int, prefix, last, lengths):
  """history [B, L] of freshly prefilled rows: prefix [B, P] (each prompt but its last token,
  right-padded), then the last token [B] at slot lengths - 1 [B]."""
  b, p = prefix.shape
  history = jnp.zeros((b, cache_length), jnp.int32).at[:, :p].set(prefix.astype(jnp.int32))
  return history.at[jnp.arange(b), lengths - 1].set(last.astype(jnp.int32), mode="drop")


def record(history, slot, tokens, length):
  """Writes the committed tokens [B, S] (length [B] of them) at slots slot + 1 .. [B]."""
  b, s = tokens.shape
  cols = slot[:, None] + 1 + jnp.arange(s)[None, :]
  cols = jnp.where(jnp.arange(s)[None, :] < length[:, None], cols, history.shape[1])
  return history.at[jnp.arange(b)[:, None], cols].set(tokens.astype(jnp.int32), mode="drop")


def propose(history, end, min_match: int, max_drafts: int):
  """history [B, L] (valid through slot end [B], the last committed token) -> (drafts
  [B, max_drafts] i32, how many are proposed [B] i32, a match of >= min_match tokens found [B]).

  The match ending at slot c - 1 (c <= end, so that a continuation is known) with the most
  suffix tokens equal, ties to the latest; its continuation history[c ..] runs up to end."""
  b, length = history.shape
  cols = jnp.arange(length)[None, :]
  run = jnp.ones((b, length), bool)
  matched = jnp.zeros((b, length), jnp.int32)
  for i in range(1, MAX_MATCH + 1):
    want = jnp.take_along_axis(history, jnp.maximum(end - i + 1, 0)[:, None], axis=1)   # [B, 1]
    shifted = jnp.pad(history, ((0, 0), (i, 0)))[:, :length]                           # [c - i]
    run = run & (shifted == want) & (cols >= i) & ((end - i + 1) >= 0)[:, None]
    matched = matched + run
  matched = jnp.where(cols <= end[:, None], matched, 0)
  best = jnp.argmax(matched * length + cols, axis=1)                  # longest, then latest
  size = jnp.take_along_axis(matched, best[:, None], axis=1)[:, 0]
  found = size >= min_match
  at = jnp.minimum(best[:, None] + jnp.arange(max_drafts)[None, :], length - 1)
  drafts = jnp.take_along_axis(history, at, axis=1)
  count = jnp.where(found, jnp.minimum(end - best + 1, max_drafts), 0).astype(jnp.int32)
  return drafts, count, found


def take(use, drafts, count, tokens, length, accept):
  """Rows `use` [B] take the looked-up drafts [B, S-1] (count [B] of them) as their pending
  input: tokens [B, S] (x first), length [B] = 1 + drafts, acceptance estimates [B, S] (1: the
  width rule always sends them)."""
  s = tokens.shape[1]
  keep = use[:, None] & (jnp.arange(1, s)[None, :] <= count[:, None])
  tail = jnp.where(keep, drafts, jnp.where(use[:, None], 0, tokens[:, 1:]))
  tokens = jnp.concatenate([tokens[:, :1], tail], axis=1)
  return (tokens, jnp.where(use, 1 + count, length).astype(length.dtype),
          jnp.where(use[:, None], 1.0, accept))
