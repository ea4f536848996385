"""A draft tree for verified decoding: k chains of drafts that share the committed token x.

With `branches` k > 1 the micro decoder drafts k chains after x: chain c starts from its c-th
most probable first draft and goes on greedily, up to S - 1 drafts each. The base checks all
of them in ONE forward over N = 1 + k (S - 1) inputs, each attending to the committed cache and
to its own ancestors in the tree (`kv_attention.cached_attention`'s block_mask) at RoPE position
x's + its depth; the longest accepted path is committed, its KV entries written in path order,
so the cache holds exactly what a chain would have left. On a memory-bound accelerator a wider
forward costs about what a narrow one does while more drafts are accepted (the first draft
is the one most often wrong); on a CPU the wider forward and k-fold drafting cost more.

Node layout (static): node 0 is x; node 1 + c (S - 1) + (d - 1) is chain c's draft at depth d.

    tree = DraftTree(branches=2, steps=4)       # 7 nodes
    pending, proposed = tree.inputs(chains, lengths)
    best, accepted, nxt = tree.accept_greedy(logits, pending, proposed)
    path = tree.path(best)                      # [B, S] node of each depth on the way to best
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.decode import sampling

MAX_BRANCHES = 8


def check_branches(branches: int, verify: bool, draft_width_rule) -> None:
  """ValueError unless `branches` chains can be drafted: 1..MAX_BRANCHES, more than one only
  with verified decoding and without the width rule."""
  if not 1 <= branches <= MAX_BRANCHES:
    raise ValueError(f"draft_branches must be in 1..{MAX_BRANCHES}, got {branches}.")
  if branches > 1 and not verify:
    raise ValueError("draft_branches > 1 drafts a tree for verified decoding: add verify "
                     "(--verify) or use draft_branches 1.")
  if branches > 1 and draft_width_rule:
    raise ValueError("draft_branches > 1 sends every chain's drafts: drop draft_width_rule.")


def forward_inputs(steps: int, branches: int = 1) -> int:
  """The most inputs a verified forward feeds per row: x and `branches` chains of steps - 1."""
  return 1 + branches * (steps - 1)


@dataclasses.dataclass(frozen=True)
class DraftTree:
  branches: int   # k chains
  steps: int      # S: x plus up to S - 1 drafts per chain

  @property
  def size(self) -> int:
    """N: the forward's inputs."""
    return forward_inputs(self.steps, self.branches)

  def node(self, chain: int, depth: int) -> int:
    return 0 if depth == 0 else 1 + chain * (self.steps - 1) + depth - 1

  @functools.cached_property
  def depth(self) -> np.ndarray:
    """[N] i32: each node's depth (x: 0)."""
    return np.array([0] + [d for _ in range(self.branches) for d in range(1, self.steps)],
                    np.int32)

  @functools.cached_property
  def parent(self) -> np.ndarray:
    """[N] i32: each node's parent (x: itself)."""
    return np.array([0] + [self.node(c, d - 1) for c in range(self.branches)
                           for d in range(1, self.steps)], np.int32)

  @functools.cached_property
  def ancestors(self) -> np.ndarray:
    """[N, S] i32: the node at each depth on the way from x to node n (n itself beyond its
    depth)."""
    out = np.zeros((self.size, self.steps), np.int32)
    for n in range(self.size):
      m = n
      out[n, :] = n
      for d in range(self.depth[n], -1, -1):
        out[n, d] = m
        m = self.parent[m]
    return out

  @functools.cached_property
  def mask(self) -> np.ndarray:
    """[N, N] bool: input t sees input u (u is t or one of its ancestors)."""
    out = np.zeros((self.size, self.size), bool)
    for n in range(self.size):
      out[n, self.ancestors[n, :self.depth[n] + 1]] = True
    return out

  def inputs(self, chains, lengths):
    """chains [B, k, S] (x, then chain c's drafts), lengths [B, k] (1 + drafts) -> (the forward's
    tokens [B, N], proposed [B, N] bool: the node holds a draft (x: True))."""
    b = chains.shape[0]
    tokens = [chains[:, 0, 0]]
    proposed = [jnp.ones((b,), bool)]
    for c in range(self.branches):
      for d in range(1, self.steps):
        tokens.append(chains[:, c, d])
        proposed.append(d < lengths[:, c])
    return jnp.stack(tokens, axis=1), jnp.stack(proposed, axis=1)

  def accept_greedy(self, logits, pending, proposed):
    """The base's logits [B, N, V] after each input -> (best node [B]: the deepest accepted one,
    the lowest chain first; accepted drafts [B] (its depth); the base's token after it [B])."""
    g = sampling.greedy_tokens(logits)                                  # [B, N]
    ok = proposed & (pending == g[:, self.parent])
    accepted = [jnp.ones(pending.shape[:1], bool)]
    for n in range(1, self.size):
      accepted.append(ok[:, n] & accepted[self.parent[n]])
    accepted = jnp.stack(accepted, axis=1)
    score = jnp.where(accepted, jnp.asarray(self.depth)[None, :], -1)
    best = jnp.argmax(score, axis=1).astype(jnp.int32)                  # first of the deepest
    rows = jnp.arange(pending.shape[0])
    return best, jnp.asarray(self.depth)[best], g[rows, best]

  def path(self, best):
    """best [B] -> [B, S]: the node at each depth on the way to it."""
    return jnp.asarray(self.ancestors)[best]

  def chain_path(self, chain: int = 0) -> np.ndarray:
    """[S]: the nodes of one chain, x first."""
    return np.array([self.node(chain, d) for d in range(self.steps)], np.int32)


def take_path(x, path, axis: int = 1):
  """x [B, .., N, ..] (nodes on `axis`), path [B, S] -> x's entries along the path [B, .., S, ..]."""
  idx = path.reshape(path.shape[:1] + (1,) * (axis - 1) + path.shape[1:]
                     + (1,) * (x.ndim - axis - 1))
  return jnp.take_along_axis(x, idx, axis=axis)


def take_entries(entries, path):
  """The forward's new KV entries (per layer, [B, N, ..] per buffer: `kv_cache.make_entries`)
  along path [B, S], in path order: what a chain's forward would have returned."""
  return jax.tree_util.tree_map(lambda x: take_path(x, path), entries)
