"""The decode state carried through the jitted macro-step loop, its writes, and its host view.

B rows, L = KV buffer length (macro slots), N = output buffer length, S = max group size
(1 for plain base-model decoding), F = feature vectors per position (1 for base decoding).

Slot vs position: the KV slot grows by one per macro step, the RoPE position by the group length
(spec §3). The *pending group* is the input the next loop iteration feeds to the base model: at
the start it is the prompt's last token (a group of one at position T - 1, slot T - 1, after a
prefill of slots 0..T-2); afterwards it is the group just emitted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.decode.sampling import SamplingParams

# Finish reasons (DecodeState.finish). RUNNING rows are still decoding; STOP = an extra stop id.
RUNNING, EOS, LENGTH, BUFFER_FULL, PADDING, STOP = 0, 1, 2, 3, 4, 5
FINISH_NAMES = {RUNNING: "running", EOS: "eos", LENGTH: "length", BUFFER_FULL: "buffer_full",
                PADDING: "padding", STOP: "stop"}
MAX_EOS = 8   # static length of DecodeKnobs.eos_ids
MAX_STOP = 8  # static length of DecodeKnobs.stop_ids
MAX_FENCE = 32  # static length of DecodeKnobs.fence_ids


@flax.struct.dataclass
class DecodeKnobs:
  """Per-row runtime settings, all traced arrays (changing them never recompiles)."""
  confidence: jax.Array      # [B] f32 in (0, 1]: continue a group while 1 - sigmoid(stop) >= it
  min_token_prob: jax.Array  # [B] f32 in [0, 1]: a drafted token is kept only if its prob >= it
  max_new_tokens: jax.Array  # [B] i32 >= 1: exact output budget of the row
  max_group: jax.Array       # [B] i32 in 1..S: runtime cap on the group size (1 = base decoding)
  eos_ids: jax.Array         # [B, MAX_EOS] i32: end-of-sequence ids, padded with -1
  stop_ids: jax.Array        # [B, MAX_STOP] i32: extra stop ids (finish reason "stop"), -1 pads
  sampling: SamplingParams   # temperature / top-k / top-p, each [B]
  # [B, MAX_FENCE] i32, -1 pads: code-fence ids. A group ends after a fence token, and between an
  # opening and a closing fence every group is one token (code decodes as the base does).
  fence_ids: jax.Array

  @classmethod
  def make(cls, rows: int, *, confidence: float, min_token_prob: float, max_new_tokens: int,
           max_group: int, eos_ids, sampling: SamplingParams, stop_ids=(),
           fence_ids=()) -> "DecodeKnobs":
    """The same (already validated) settings for `rows` rows."""
    fill = lambda value, dtype: jnp.full((rows,), value, dtype)
    ids = lambda xs, n: jnp.tile(jnp.asarray(list(xs) + [-1] * (n - len(xs)), jnp.int32),
                                 (rows, 1))
    return cls(fill(confidence, jnp.float32), fill(min_token_prob, jnp.float32),
               fill(max_new_tokens, jnp.int32), fill(max_group, jnp.int32),
               ids(eos_ids, MAX_EOS), ids(stop_ids, MAX_STOP),
               jax.tree_util.tree_map(lambda x: jnp.full((rows,), x), sampling),
               ids(fence_ids, MAX_FENCE))


@flax.struct.dataclass
class MicroPolicy:
  """When the batch runs another micro step (traced, batch-wide).

  It does while at least max(1, min(min_rows, R), ceil(fraction * R)) rows continue their
  group, R = rows still decoding; rows cut short end their group there. "all" (min_rows 1,
  fraction 0): while any row continues, so every row decodes exactly as it would alone.
  """
  min_rows: jax.Array   # [] i32
  fraction: jax.Array   # [] f32

  @classmethod
  def parse(cls, spec: str) -> "MicroPolicy":
    """"all" | "min_rows:K" (K >= 1) | "fraction:F" (0 <= F <= 1)."""
    kind, _, value = spec.partition(":")
    try:
      if kind == "all" and not value:
        return cls(jnp.int32(1), jnp.float32(0.0))
      if kind == "min_rows" and int(value) >= 1:
        return cls(jnp.int32(int(value)), jnp.float32(0.0))
      if kind == "fraction" and 0.0 <= float(value) <= 1.0:
        return cls(jnp.int32(1), jnp.float32(float(value)))
    except ValueError:
      pass
    raise ValueError(f"Unknown micro_policy {spec!r}: use 'all', 'min_rows:K' (K >= 1) or "
                     "'fraction:F' (0 <= F <= 1).")

  def allows(self, continuing, running):
    """continuing, running: [B] bool -> [] bool: run another micro step."""
    r = jnp.sum(running, dtype=jnp.int32)
    need = jnp.maximum(jnp.minimum(self.min_rows, r),
                       jnp.ceil(self.fraction * r).astype(jnp.int32))
    return jnp.sum(continuing & running, dtype=jnp.int32) >= jnp.maximum(need, 1)


@flax.struct.dataclass
class DecodeState:
  """Everything the loop carries (a pytree of arrays; see the module docstring for letters)."""
  cache: Any                 # list per base layer of {"k", "v"}: [B, L, kv_heads * head_dim]
  slot: jax.Array            # [B] i32: KV slot the pending group is written to
  position: jax.Array        # [B] i32: RoPE position of the pending group (its last token's)
  group_tokens: jax.Array    # [B, S] i32: the pending group, zero-padded
  group_len: jax.Array       # [B] i32: its length (>= 1)
  out_tokens: jax.Array      # [B, N] i32: generated tokens (EOS included), zero after num_out
  out_group: jax.Array       # [B, N] i32: macro-step index (0, 1, ..) of each generated token
  out_logprob: jax.Array     # [B, N] f32: log-probability of each token under the model
  out_logit: jax.Array       # [B, N] f32: the logit of each chosen token
  out_stop: jax.Array        # [B, N] f32: the stop logit at each token (0 for base decoding)
  num_out: jax.Array         # [B] i32: tokens generated so far
  macro_steps: jax.Array     # [B] i32: groups emitted so far (= base forwards of the row)
  done: jax.Array            # [B] bool: the row has finished
  in_fence: jax.Array        # [B] bool: the row's output is inside a code fence (knobs.fence_ids)
  finish: jax.Array          # [B] i32: finish reason (RUNNING, EOS, LENGTH, BUFFER_FULL, ..)
  rng: jax.Array             # [B, 2] PRNG key per row; step keys fold_in(macro step, micro step)
  iteration: jax.Array       # [] i32: loop iterations run so far (all rows)
  out_start: jax.Array       # [B] i32: num_out at out_tokens[:, 0] (0 unless streamed in chunks)
  knobs: DecodeKnobs         # traced per-row runtime settings
  micro_policy: MicroPolicy  # traced batch-wide micro-step policy
  # Verified decoding only (`decode/verify.py`), None otherwise: the micro outputs of the pending
  # drafts [B, S, D] f32, per draft index the drafts reached / accepted so far [B, 2, S], and
  # each pending draft's acceptance estimate given the ones before [B, S] f32 (index 0 unused).
  draft_hidden: Any = None
  draft_counts: Any = None
  draft_accept: Any = None
  # A draft tree's other chains (`draft_tree`; engine.draft_branches k > 1): [B, k - 1, S] i32
  # (x, then the chain's drafts) and their lengths [B, k - 1].
  branch_tokens: Any = None
  branch_len: Any = None
  # Lookup drafts (`decode/lookup_drafts.py`; engine.lookup_drafts): each row's committed tokens
  # by KV slot [B, L] i32, and whether its pending drafts were looked up [B] bool (a sampled row
  # checks them with a one-hot q).
  history: Any = None
  drafts_looked_up: Any = None
  # The width rule (`decode/draft_width.py`; engine.draft_width_rule): the relative cost of a
  # verified step at each forward width (`verify.forward_widths`), a tuple of [] f32 (batch-wide;
  # traced, so costs timed on the decoding machine never recompile).
  width_costs: Any = None


def init_state(cache, last_tokens, prompt_lengths, done, rng, knobs: DecodeKnobs,
               policy: MicroPolicy, max_steps: int, out_length: int) -> DecodeState:
  """The state right after prefill. last_tokens [B]: each prompt's last token; lengths [B];
  rng [B, 2]: one key per row."""
  b = last_tokens.shape[0]
  # A fresh buffer per field: the state is donated, and a buffer may be donated only once.
  zeros = lambda: jnp.zeros((b, out_length), jnp.int32)
  fzeros = lambda: jnp.zeros((b, out_length), jnp.float32)
  group = jnp.zeros((b, max_steps), jnp.int32).at[:, 0].set(last_tokens)
  return DecodeState(
      cache=cache, slot=prompt_lengths - 1, position=prompt_lengths - 1, group_tokens=group,
      group_len=jnp.ones((b,), jnp.int32), out_tokens=zeros(), out_group=zeros(),
      out_logprob=fzeros(), out_logit=fzeros(), out_stop=fzeros(), num_out=jnp.zeros((b,), jnp.int32),
      macro_steps=jnp.zeros((b,), jnp.int32), done=done, in_fence=jnp.zeros((b,), bool),
      finish=jnp.where(done, PADDING, RUNNING).astype(jnp.int32), rng=rng,
      iteration=jnp.zeros((), jnp.int32), out_start=jnp.zeros((b,), jnp.int32), knobs=knobs,
      micro_policy=policy)


def masked_set(buf, offsets, values, lengths):
  """Writes values [B, S] into buf [B, N] at offsets [B] + (0..lengths[b]-1); the rest is dropped.

  Variable-length, per-row writes into a fixed-shape buffer (columns >= N are dropped too).
  """
  b, s = values.shape
  n = buf.shape[1]
  cols = offsets[:, None] + jnp.arange(s)[None, :]
  cols = jnp.where(jnp.arange(s)[None, :] < lengths[:, None], cols, n)   # n = out of range: drop
  return buf.at[jnp.arange(b)[:, None], cols].set(values.astype(buf.dtype), mode="drop")


def to_host(state: DecodeState) -> DecodeState:
  """The state's outputs as numpy (the KV cache stays on the device)."""
  return jax.device_get(state.replace(cache=None))


@dataclasses.dataclass
class DecodeResult:
  """Host-side outputs of a decode call, per real row (padding rows removed).

  tokens[b]: generated ids (EOS included); group_sizes[b]: size of each macro step's group;
  logprobs / logits / stop_logits[b]: per token (model log-probability, chosen logit, stop logit);
  finish_reasons[b]: "eos" | "length" | "buffer_full" | "running" (a streaming snapshot).
  """
  tokens: list[list[int]]
  group_sizes: list[list[int]]
  logprobs: list[list[float]]
  logits: list[list[float]]
  stop_logits: list[list[float]]
  finish_reasons: list[str]
  macro_steps: list[int]
  prompt_lengths: list[int]
  iterations: int            # loop iterations = batched base forwards in the loop
  compile_s: float = 0.0
  prefill_s: float = 0.0
  decode_s: float = 0.0
  # Verified decoding: per draft index 1..S-1, drafts reached (proposed with every earlier draft
  # accepted) and accepted, over the real rows
  # ([2, S-1]); None for merged decoding (a "group" is then the tokens one forward committed).
  draft_counts: list[list[int]] | None = None

  @property
  def verified(self) -> bool:
    return self.draft_counts is not None

  @classmethod
  def from_state(cls, st: DecodeState, rows: int, **timings) -> "DecodeResult":
    """st: a DecodeState already on the host (numpy leaves); rows: real (unpadded) rows."""
    n = np.asarray(st.num_out) - np.asarray(st.out_start)
    take = lambda buf, cast: [[cast(x) for x in np.asarray(buf)[b, :n[b]]] for b in range(rows)]
    groups = np.asarray(st.out_group)
    sizes = [np.bincount(groups[b, :n[b]], minlength=int(st.macro_steps[b])).tolist()
             for b in range(rows)]
    # slot = T - 1 + macro steps (the prompt's last token was fed at slot T - 1); verified
    # decoding gives every committed token its own slot: slot = T - 1 + tokens.
    fed = np.asarray(st.macro_steps if st.draft_counts is None else st.num_out)[:rows]
    counts = None
    if st.draft_counts is not None:
      counts = np.asarray(st.draft_counts)[:rows, :, 1:].sum(axis=0).tolist()
    return cls(
        tokens=take(st.out_tokens, int), group_sizes=sizes, logprobs=take(st.out_logprob, float),
        logits=take(st.out_logit, float), stop_logits=take(st.out_stop, float),
        finish_reasons=[FINISH_NAMES[int(f)] for f in np.asarray(st.finish)[:rows]],
        macro_steps=[int(m) for m in np.asarray(st.macro_steps)[:rows]],
        prompt_lengths=[int(x) + 1 for x in np.asarray(st.slot)[:rows] - fed],
        iterations=int(st.iteration), draft_counts=counts, **timings)

  def groups(self, row: int) -> list[list[int]]:
    """Row `row`'s tokens cut into its macro-step groups."""
    out, i = [], 0
    for size in self.group_sizes[row]:
      out.append(self.tokens[row][i:i + size])
      i += size
    return out

  def stats(self) -> dict[str, Any]:
    """Totals over rows: tokens, macro steps, KV slots (vs plain decoding's), timings."""
    new = sum(len(t) for t in self.tokens)
    steps = sum(self.macro_steps)
    prompt = sum(self.prompt_lengths)
    stats = {
        "rows": len(self.tokens), "prompt_tokens": prompt, "new_tokens": new,
        "macro_steps": steps, "tokens_per_macro_step": new / max(steps, 1),
        # Slots a row fills: its prompt, then one per group except the last (never fed);
        # verified decoding: one per token, as the base.
        "kv_slots_used": prompt + (new if self.verified else steps) - len(self.tokens),
        "kv_slots_base": prompt + new - len(self.tokens),
        "loop_iterations": self.iterations, "prefill_s": self.prefill_s,
        "decode_s": self.decode_s, "decode_tokens_per_s": new / max(self.decode_s, 1e-9),
        "compile_s": self.compile_s, "finish_reasons": list(self.finish_reasons),
    }
    if self.verified:
      reached, accepted = self.draft_counts
      stats.update(mode="verify", tokens_per_forward=new / max(steps, 1),
                   drafts_reached=reached, drafts_accepted=accepted,
                   # P(draft j accepted | proposed and drafts 1..j-1 accepted), j = 1..S-1
                   acceptance=[a / r if r else None for r, a in zip(reached, accepted)])
    return stats
