"""The micro-step decoder: base-model features -> up to S tokens of one macro step.

Input sequence (length F + S - 1, RoPE positions 0..F+S-2, causal):
    [f_1, .., f_{F-1}, f_norm, e(t_0), .., e(t_{S-2})]
Micro step 0's output is f_norm itself (a skip connection, so its logits are the base model's
next-token logits); step j >= 1 is the decoder output at index F - 1 + j. The LM head reads the
outputs with no extra norm; the stop head (Linear, SiLU, Linear, SiLU, Linear -> 1) reads the same.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from hamburger_jax.model.kv_cache import init_cache
from hamburger_jax.model.config import HamburgerConfig
from hamburger_jax.model.execution import Execution
from hamburger_jax.model.layers import dense
from hamburger_jax.model.llama import make_layers, run_layers, scan_layers


class StopHead(nn.Module):
  """[..., D] -> stop logit [...] (float32)."""
  cfg: HamburgerConfig

  @nn.compact
  def __call__(self, x):
    base = self.cfg.base
    d = base.hidden_size
    x = nn.silu(dense(d, ("embed", "mlp"), base, "dense_0", use_bias=True)(x))
    x = nn.silu(dense(d, ("mlp", "embed"), base, "dense_1", use_bias=True)(x))
    return dense(1, ("embed", "stop"), base, "dense_2", use_bias=True)(x)[..., 0].astype(
        jnp.float32)


class MicroStepDecoder(nn.Module):
  """`num_micro_layers` Llama decoder layers (own weights) plus the stop head."""
  cfg: HamburgerConfig
  execution: Execution = Execution()

  def setup(self):
    self.layers = make_layers(self.cfg.base, self.execution, self.cfg.num_micro_layers)
    self.stop_head = StopHead(self.cfg, name="stop_head")

  def stop(self, hidden):
    return self.stop_head(hidden)

  def teacher_forced(self, features, token_embeds):
    """All micro steps at once.

    features [N, F, D], token_embeds [N, S - 1, D] (embeddings of the group's first S - 1
    tokens) -> micro outputs [N, S, D].
    """
    n, f = features.shape[:2]
    x = jnp.concatenate([features, token_embeds.astype(features.dtype)], axis=1)
    length = x.shape[1]
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (n, length))
    if self.execution.scan_layers and not self.is_initializing():   # one compiled layer body
      h, _ = scan_layers(self.cfg.base, self.execution, self.variables["params"], x, positions,
                         None, num_layers=self.cfg.num_micro_layers)
    else:
      h, _, _ = run_layers(self.layers, x, positions, None, None, None)
    return jnp.concatenate([features[:, f - 1:f], h[:, f:]], axis=1)

  def prefill(self, features):
    """features [B, F, D] -> a fresh micro KV cache with slots 0..F-1 filled."""
    b, f = features.shape[:2]
    cache = init_cache(self.cfg.base, self.cfg.num_micro_layers, b, self.cfg.micro_length)
    positions = jnp.broadcast_to(jnp.arange(f, dtype=jnp.int32), (b, f))
    slots = jnp.zeros((b,), jnp.int32)
    _, _, cache = run_layers(self.layers, features, positions, None, cache, slots)
    return cache

  def prefill_step(self, features, token_embed):
    """`prefill` and micro step 1 in one pass (the layers' weights read once, not twice):
    features [B, F, D], token_embed [B, D] of step 0's token -> (step 1's out [B, D], a fresh
    micro KV cache with slots 0..F filled)."""
    b, f = features.shape[:2]
    cache = init_cache(self.cfg.base, self.cfg.num_micro_layers, b, self.cfg.micro_length)
    x = jnp.concatenate([features, token_embed[:, None].astype(features.dtype)], axis=1)
    positions = jnp.broadcast_to(jnp.arange(f + 1, dtype=jnp.int32), (b, f + 1))
    h, _, cache = run_layers(self.layers, x, positions, None, cache, jnp.zeros((b,), jnp.int32))
    return h[:, f], cache

  def step(self, token_embed, step, cache):
    """Micro step `step` >= 1: token_embed [B, D] of the previous token -> (out [B, D], cache)."""
    b = token_embed.shape[0]
    slot = jnp.full((b,), self.cfg.num_features - 1, jnp.int32) + step
    h, _, cache = run_layers(self.layers, token_embed[:, None].astype(self.cfg.base.jnp_dtype),
                             slot[:, None], None, cache, slot)
    return h[:, 0], cache

  def __call__(self, features, token_embeds):
    out = self.teacher_forced(features, token_embeds)
    return out, self.stop(out)
