"""The compositional embedder: a group of up to S tokens -> ONE input embedding.

    s == 1: the plain token embedding.
    s  > 1: mean(E) + out_proj(merge(E)), where merge is one multi-head cross-attention whose
            query is q_proj(mean(E)) and whose keys/values are k_proj/v_proj of
            concat(E, pos[:s]) (a learned [S, D/2] table), softmax over the s tokens.

Groups are padded to S with a length, so shapes stay static.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from hamburger_jax.model.config import HamburgerConfig
from hamburger_jax.model.layers import default_init, dense, logical
from hamburger_jax.model.stored_params import stored_param


class CompositionalEmbedder(nn.Module):
  """Merges plain embeddings E [..., S, D] of groups with lengths [...] into [..., D]."""
  cfg: HamburgerConfig

  def __call__(self, embeds, lengths, skip_unmerged: bool = False):
    """skip_unmerged (static): when no group holds >= 2 tokens, return the plain embeddings
    without computing the merge (a branch; the same result)."""
    if not skip_unmerged:
      return self.merge(embeds, lengths)
    return nn.cond(jnp.any(lengths > 1), lambda mdl, e, n: mdl.merge(e, n),
                   lambda mdl, e, n: e[..., 0, :].astype(self.cfg.base.jnp_dtype),
                   self, embeds, lengths)

  @nn.compact
  def merge(self, embeds, lengths):
    """The merged embeddings [..., D] (a group of one token: its plain embedding)."""
    base = self.cfg.base
    d, s, heads = base.hidden_size, self.cfg.max_steps, self.cfg.merger_heads
    head_dim = d // heads
    pos = stored_param(self, "pos", logical(default_init, ("max_steps", "embed")), (s, d // 2),
                       base.jnp_param_dtype)
    valid = jnp.arange(s) < lengths[..., None]                       # [..., S]
    count = jnp.maximum(lengths, 1)[..., None].astype(jnp.float32)
    mean = (jnp.where(valid[..., None], embeds.astype(jnp.float32), 0.0).sum(-2)
            / count).astype(base.jnp_dtype)                          # [..., D]

    kv_in = jnp.concatenate(
        [embeds.astype(base.jnp_dtype),
         jnp.broadcast_to(pos.astype(base.jnp_dtype), embeds.shape[:-1] + (d // 2,))], axis=-1)
    q = dense(d, ("embed", "heads"), base, "q_proj", use_bias=True)(mean)
    k = dense(d, ("embed", "heads"), base, "k_proj", use_bias=True)(kv_in)
    v = dense(d, ("embed", "heads"), base, "v_proj", use_bias=True)(kv_in)
    q = q.reshape(q.shape[:-1] + (heads, head_dim))                  # [..., h, d]
    k = k.reshape(k.shape[:-1] + (heads, head_dim))                  # [..., S, h, d]
    v = v.reshape(v.shape[:-1] + (heads, head_dim))
    scores = jnp.einsum("...hd,...shd->...hs", q, k, preferred_element_type=jnp.float32)
    scores = scores / jnp.sqrt(jnp.float32(head_dim))
    scores = jnp.where(valid[..., None, :], scores, -1e30)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    merged = jnp.einsum("...hs,...shd->...hd", probs, v).reshape(mean.shape)
    out = mean + dense(d, ("heads", "embed"), base, "out_proj", use_bias=True)(merged)
    single = embeds[..., 0, :].astype(out.dtype)
    return jnp.where((lengths <= 1)[..., None], single, out)
