"""The base Llama model (HF `LlamaForCausalLM` semantics), pure functional.

    LlamaModel(cfg).apply({"params": p}, tokens, positions=pos, segment_ids=seg)
        -> LlamaOutput(logits [B, T, V], hidden [B, T, D], features, cache)

Inputs are token ids or ready embeddings (the HAMburger embedder feeds merged ones). `features`
holds the raw outputs of the requested layers plus the final-normed output, stacked [B, T, F, D].
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from hamburger_jax.model.attention import Attention, causal_segment_mask
from hamburger_jax.model.config import LlamaConfig
from hamburger_jax.model.layers import RMSNorm, SwiGLU, default_init, dense, logical


class LlamaOutput(NamedTuple):
  logits: jax.Array | None     # [B, T, V] (None when not asked for)
  hidden: jax.Array            # [B, T, D] final-normed output of the last layer
  features: jax.Array | None   # [B, T, F, D]: raw outputs of feature_layers, then `hidden`
  cache: Any                   # list of per-layer {"k", "v"} buffers, or None


class DecoderLayer(nn.Module):
  """Pre-RMSNorm attention and SwiGLU MLP, each with a residual connection."""
  cfg: LlamaConfig

  @nn.compact
  def __call__(self, x, positions, mask=None, cache=None, cache_slots=None):
    c = self.cfg
    norm = lambda name: RMSNorm(c.rms_norm_eps, c.jnp_dtype, c.jnp_param_dtype, name=name)
    h, cache = Attention(c, name="self_attn")(norm("input_layernorm")(x), positions, mask, cache,
                                              cache_slots)
    x = x + h
    x = x + SwiGLU(c, name="mlp")(norm("post_attention_layernorm")(x))
    return x, cache


def run_layers(layers: Sequence[DecoderLayer], x, positions, mask, cache, cache_slots,
               tap_layers: Sequence[int] = ()):
  """Runs decoder layers in order; returns (x, taps of `tap_layers`, new cache or None)."""
  taps, new_cache = [], [] if cache is not None else None
  for i, layer in enumerate(layers):
    x, layer_cache = layer(x, positions, mask, None if cache is None else cache[i], cache_slots)
    if cache is not None:
      new_cache.append(layer_cache)
    if i in tap_layers:
      taps.append(x)
  return x, taps, new_cache


class LlamaModel(nn.Module):
  """Token embedding, `num_layers` decoder layers, final RMSNorm, LM head (tied or not)."""
  cfg: LlamaConfig

  def setup(self):
    c = self.cfg
    self.embed_tokens = nn.Embed(c.vocab_size, c.hidden_size, dtype=c.jnp_dtype,
                                 param_dtype=c.jnp_param_dtype,
                                 embedding_init=logical(default_init, ("vocab", "embed")))
    self.layers = [DecoderLayer(c, name=f"layers_{i}") for i in range(c.num_layers)]
    self.norm = RMSNorm(c.rms_norm_eps, c.jnp_dtype, c.jnp_param_dtype)
    if not c.tie_word_embeddings:
      self.lm_head = dense(c.vocab_size, ("embed", "vocab"), c, "lm_head")

  def embed(self, tokens):
    """tokens [...] int -> embeddings [..., D]."""
    return self.embed_tokens(tokens)

  def logits(self, hidden):
    """hidden [..., D] -> logits [..., V] in float32 (no norm applied here)."""
    if self.cfg.tie_word_embeddings:
      out = self.embed_tokens.attend(hidden)
    else:
      out = self.lm_head(hidden)
    return out.astype(jnp.float32)

  def __call__(self, tokens=None, *, embeddings=None, positions=None, segment_ids=None,
               cache=None, cache_slots=None, feature_layers: Sequence[int] = (),
               return_logits: bool = True) -> LlamaOutput:
    """Forward over tokens [B, T] (or embeddings [B, T, D]).

    positions [B, T]: RoPE positions (default 0..T-1). Without a cache, attention is causal and
    limited to equal `segment_ids` [B, T] (packed rows). With a cache (a list of per-layer
    buffers), entries are written at slots `cache_slots[b] + t` and queries see every earlier slot.
    """
    if embeddings is None:
      if tokens is None:
        raise ValueError("Pass tokens or embeddings.")
      embeddings = self.embed(tokens)
    b, t = embeddings.shape[:2]
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    mask = None
    if cache is None:
      if segment_ids is None:
        segment_ids = jnp.ones((b, t), jnp.int32)
      mask = causal_segment_mask(segment_ids)
    elif cache_slots is None:
      raise ValueError("cache_slots [B] is required with a cache.")
    x, taps, cache = run_layers(self.layers, embeddings.astype(self.cfg.jnp_dtype), positions,
                                mask, cache, cache_slots, tuple(feature_layers))
    hidden = self.norm(x)
    features = jnp.stack([*taps, hidden], axis=2) if feature_layers else None
    logits = self.logits(hidden) if return_logits else None
    return LlamaOutput(logits, hidden, features, cache)


def init_llama_params(cfg: LlamaConfig, rng: jax.Array, boxed: bool = False):
  """Random parameters of the base model (unboxed arrays unless `boxed`)."""
  tokens = jnp.zeros((1, 2), jnp.int32)
  params = LlamaModel(cfg).init(rng, tokens)["params"]
  return params if boxed else nn.meta.unbox(params)
