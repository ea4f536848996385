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
from jax.ad_checkpoint import checkpoint_name

from hamburger_jax.model import partitioning as pt
from hamburger_jax.model.attention import Attention
from hamburger_jax.model.config import LlamaConfig
from hamburger_jax.model.execution import SUBLAYER_INPUT, Execution, remat_policy
from hamburger_jax.model.layers import (RMSNorm, SwiGLU, attend_rows, default_init, dense,
                                        logical)
from hamburger_jax.model.quantize import Embed, scale_logits

_RESIDUAL = (pt.BATCH, pt.LENGTH, pt.EMBED)


class LlamaOutput(NamedTuple):
  logits: jax.Array | None     # [B, T, V] (None when not asked for)
  hidden: jax.Array            # [B, T, D] final-normed output of the last layer
  features: jax.Array | None   # [B, T, F, D]: raw outputs of feature_layers, then `hidden`
  cache: Any                   # list of per-layer {"k", "v"} buffers, or None


class DecoderLayer(nn.Module):
  """Pre-RMSNorm attention and SwiGLU MLP, each with a residual connection."""
  cfg: LlamaConfig
  execution: Execution = Execution()

  @nn.compact
  def __call__(self, x, positions, segment_ids=None, cache=None, cache_slots=None,
               block_mask=None):
    c = self.cfg
    norm = lambda name, x: checkpoint_name(
        RMSNorm(c.rms_norm_eps, c.jnp_dtype, c.jnp_param_dtype, name=name)(x), SUBLAYER_INPUT)
    x = pt.constrain(x, _RESIDUAL)
    h, cache = Attention(c, self.execution, name="self_attn")(
        norm("input_layernorm", x), positions, segment_ids, cache, cache_slots, block_mask)
    x = x + h
    x = x + SwiGLU(c, name="mlp")(norm("post_attention_layernorm", x))
    return pt.constrain(x, _RESIDUAL), cache


def make_layers(cfg: LlamaConfig, execution: Execution, num_layers: int) -> list[DecoderLayer]:
  """`layers_0 ..`: decoder layers, each under `jax.checkpoint` with the execution's policy."""
  cls = DecoderLayer
  if execution.remat != "none":
    cls = nn.remat(DecoderLayer, policy=remat_policy(execution.remat))
  return [cls(cfg, execution, name=f"layers_{i}") for i in range(num_layers)]


def run_layers(layers: Sequence[DecoderLayer], x, positions, segment_ids, cache, cache_slots,
               tap_layers: Sequence[int] = (), layer_hook=None, block_mask=None):
  """Runs decoder layers in order; returns (x, taps of `tap_layers`, new cache or None).

  layer_hook(i, x_in, x_out) -> x_out, if given, rewrites each layer's output (merge adapter).
  block_mask [T, T]: the cached inputs form a tree (`kv_attention.cached_attention`).
  """
  taps, new_cache = [], [] if cache is not None else None
  for i, layer in enumerate(layers):
    x_in = x
    x, layer_cache = layer(x, positions, segment_ids, None if cache is None else cache[i],
                           cache_slots, block_mask)
    if layer_hook is not None:
      x = layer_hook(i, x_in, x)
    if cache is not None:
      new_cache.append(layer_cache)
    if i in tap_layers:
      taps.append(x)
  return x, taps, new_cache


def scan_segments(num_layers: int, tap_layers: Sequence[int]) -> list[tuple[int, int]]:
  """[lo, hi) runs of layers that end at each tap (and at the last layer)."""
  ends = sorted({i + 1 for i in tap_layers} | {num_layers})
  return list(zip([0] + ends[:-1], ends))


def _stack(layer_params, lo: int, hi: int):
  """Per-layer params `layers_{lo..hi-1}` stacked along a new leading axis."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *[layer_params[f"layers_{i}"]
                                                   for i in range(lo, hi)])


def scan_layers(cfg: LlamaConfig, execution: Execution, layer_params, x, positions, segment_ids,
                tap_layers: Sequence[int] = (), num_layers: int | None = None):
  """The uncached forward as `lax.scan`s over stacked per-layer params -> (x, taps).

  layer_params: {"layers_0": .., ..} (the usual layout). When the runs of layers between taps
  have one length (every preset), they are stacked [runs, run length, ..] and scanned by a scan
  of scans, so the program holds ONE layer body (and one backward): compile time flat in depth
  and in the number of taps. Otherwise each run is stacked and scanned on its own.
  """
  layer = DecoderLayer(cfg, execution, parent=None)

  def body(x, p):
    return layer.apply({"params": p}, x, positions, segment_ids)[0], None

  if execution.remat != "none":
    body = jax.checkpoint(body, policy=remat_policy(execution.remat), prevent_cse=False)
  segments = scan_segments(num_layers or cfg.num_layers, tap_layers)
  tapped = [hi - 1 in tap_layers for _, hi in segments]
  if len({hi - lo for lo, hi in segments}) == 1:
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs),
                           *[_stack(layer_params, lo, hi) for lo, hi in segments])
    run = lambda x, p: (lambda y: (y, y))(jax.lax.scan(body, x, p)[0])
    x, ends = jax.lax.scan(run, x, stacked)
    return x, [ends[i] for i, t in enumerate(tapped) if t]
  taps = []
  for (lo, hi), t in zip(segments, tapped):
    x, _ = jax.lax.scan(body, x, _stack(layer_params, lo, hi))
    if t:
      taps.append(x)
  return x, taps


class LlamaModel(nn.Module):
  """Token embedding, `num_layers` decoder layers, final RMSNorm, LM head (tied or not)."""
  cfg: LlamaConfig
  execution: Execution = Execution()

  def setup(self):
    c = self.cfg
    self.embed_tokens = Embed(c.vocab_size, c.hidden_size, dtype=c.jnp_dtype,
                              param_dtype=c.jnp_param_dtype,
                              embedding_init=logical(default_init, ("vocab", "embed")))
    self.layers = make_layers(c, self.execution, c.num_layers)
    self.norm = RMSNorm(c.rms_norm_eps, c.jnp_dtype, c.jnp_param_dtype)
    if not c.tie_word_embeddings:
      self.lm_head = dense(c.vocab_size, ("embed", "vocab"), c, "lm_head")

  def embed(self, tokens):
    """tokens [...] int -> embeddings [..., D]."""
    return self.embed_tokens(tokens)

  def logits(self, hidden, *, decoding: bool = False):
    """hidden [..., D] -> logits [..., V] in float32 (no norm applied here).

    decoding: hidden is [R, D], one position per row; a tied head then takes `attend_rows`'
    fastest form for R rows (training keeps the plain dot).
    """
    if self.cfg.tie_word_embeddings:
      if decoding and not self.embed_tokens.is_grouped():   # grouped: `attend`'s group sum
        table, scale = self.embed_tokens.head_table(self.cfg.jnp_dtype)
        return scale_logits(attend_rows(hidden.astype(table.dtype), table), scale)
      out = self.embed_tokens.attend(hidden)
    else:
      out = self.lm_head(hidden)
    return out.astype(jnp.float32)

  def __call__(self, tokens=None, *, embeddings=None, positions=None, segment_ids=None,
               cache=None, cache_slots=None, feature_layers: Sequence[int] = (),
               return_logits: bool = True, layer_hook=None, block_mask=None) -> LlamaOutput:
    """Forward over tokens [B, T] (or embeddings [B, T, D]).

    positions [B, T]: RoPE positions (default 0..T-1). Without a cache, attention is causal and
    limited to equal `segment_ids` [B, T] (packed rows). With a cache (a list of per-layer
    buffers), entries are written at slots `cache_slots[b] + t` and queries see every earlier slot.
    `layer_hook(i, x_in, x_out) -> x_out` rewrites each layer's output (it runs the layers
    unrolled, also under `scan_layers`). block_mask [T, T] bool (with a cache): query t sees new
    input u iff block_mask[t, u], instead of u <= t (a draft tree, `decode/draft_tree.py`).
    """
    if embeddings is None:
      if tokens is None:
        raise ValueError("Pass tokens or embeddings.")
      embeddings = self.embed(tokens)
    b, t = embeddings.shape[:2]
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if cache is None and segment_ids is None:
      segment_ids = jnp.ones((b, t), jnp.int32)
    if cache is not None and cache_slots is None:
      raise ValueError("cache_slots [B] is required with a cache.")
    x = embeddings.astype(self.cfg.jnp_dtype)
    if (self.execution.scan_layers and cache is None and layer_hook is None
        and not self.is_initializing()):
      x, taps = scan_layers(self.cfg, self.execution, self.variables["params"], x, positions,
                            segment_ids, tuple(feature_layers))
    else:
      x, taps, cache = run_layers(self.layers, x, positions, segment_ids, cache, cache_slots,
                                  tuple(feature_layers), layer_hook, block_mask)
    hidden = self.norm(x)
    features = jnp.stack([*taps, hidden], axis=2) if feature_layers else None
    logits = self.logits(hidden) if return_logits else None
    return LlamaOutput(logits, hidden, features, cache)


def init_llama_params(cfg: LlamaConfig, rng: jax.Array, boxed: bool = False):
  """Random parameters of the base model (unboxed arrays unless `boxed`)."""
  tokens = jnp.zeros((1, 2), jnp.int32)
  params = LlamaModel(cfg).init(rng, tokens)["params"]
  return params if boxed else nn.meta.unbox(params)
