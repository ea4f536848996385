"""One micro step's choice: pick a token from a micro output, decide whether the group goes on.

Shared by merged decoding (`decode/loop.py`) and verified decoding (`decode/verify.py`).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from hamburger_jax.decode import state as ds
from hamburger_jax.decode.sampling import sample_tokens, token_log_probs


def continue_probability(stop_logits):
  """1 - sigmoid(stop_logit): a group goes on while this is >= the confidence."""
  return jax.nn.sigmoid(-stop_logits.astype(jnp.float32))


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


def pick(engine, params, hidden, j, keys, knobs: ds.DecodeKnobs, budget,
          draft: bool = False, rank=None) -> Pick:
  """Micro step j on hidden [B, D]: sample a token, decide whether it is kept and the group goes on.

  Step 0's token (the base model's own prediction) is always kept. A drafted token (step j >= 1)
  is kept only if the model's own (untempered) probability of it is >= min_token_prob; a draft
  below it is dropped and its group ends before it. After a kept token the group goes on while
  the stop head's continue-probability is >= the confidence (min_token_prob 1 = one token per
  macro step; 0 = the stop head alone).
  keys [B, 2]: the rows' keys of this macro step. draft: j >= 1 (a model with a draft
  vocabulary then samples from its K tokens, the probability normalised as over the whole
  vocabulary, estimated; `hamburger_jax.decode.draft_vocab`). rank: (ranks [B] i32, k) or None: a
  row with rank r > 0 takes its r-th most probable token instead (a draft tree's other chains,
  greedy rows only).
  """
  ids = rest = None
  if draft and engine.model.draft_size:
    logits, stop, rest = engine.model.draft_heads(params, hidden)
    ids = params["draft"]["ids"]
  else:
    logits, stop = engine.model.heads(params, hidden)
  choice = sample_tokens(logits, jax.vmap(jax.random.fold_in, (0, None))(keys, j), knobs.sampling)
  if rank is not None:
    ranks, k = rank
    ranked = jax.lax.top_k(logits, k)[1].astype(choice.dtype)
    choice = jnp.where(ranks > 0, jnp.take_along_axis(ranked, ranks[:, None], axis=1)[:, 0],
                       choice)
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
