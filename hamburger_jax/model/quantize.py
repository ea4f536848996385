"""int8 weight-only decoding: per-output-channel symmetric int8 weights, scaled inside the matmul.

    qparams = quantize_params(params, cfg)      # once, at load; HAMburger or Llama params
    Sampler(cfg, params, quantize="int8")       # the same, inside the sampler

A quantized Dense holds {"kernel": int8 [in, out], "kernel_scale": float32 [out]} and computes
(x @ kernel) * scale, the int8 -> float convert feeding the dot: the weights live in params and
in the compiled loop as int8 (a quarter of float32's bytes, half of bfloat16's). Whether the
convert fuses into the dot is the backend's choice: XLA's CPU backend writes the converted
kernel out before its dot (so on CPU int8 saves memory, not time: docs/results/quality.md);
docs/results/tpu.md has the TPU step's bytes. The token embedding holds
{"embedding": int8 [V, D], "embedding_scale": float32 [V]}: a lookup gathers int8 rows and
scales them, and the tied LM head (logits[v] = h . E[v]) scales its logits by the same per-row
scale, which is per output channel there. `Dense` and `Embed` below read both layouts, so float
params run exactly as before and the two layouts are two compile keys of one program.

Quantized: the base's and the micro decoder's q/k/v/o/gate/up/down kernels, the LM head (or the
tied embedding). Left in float: norms, biases, the compositional embedder, the merge adapter, the
stop head (small tensors, where the error would matter most per byte saved).

Scale: per output channel, symmetric (no zero point): the one of r x absmax / 127, r in
CLIP_RATIOS, with the least squared error over the channel (an all-zero channel gets scale 1).
The round-trip error of a weight within 127 x scale is at most scale / 2; larger ones clip.

Why not Qwix (qwix 0.1.8, PtqProvider + quantize_params, tried on the tiny Llama with a KV
cache): it quantizes the decoder layers' Dense kernels of a linen module (the lowered program
reads them as i8; logits max error 0.024 at max |logit| 2.1), but (1) the tied embedding, the
largest tensor of a small Llama (SmolLM2-135M: 28M of 135M weights; Llama-3.2-1B: 263M of 1.2B),
cannot be quantized: its lookup gathers from the table and fails on Qwix's quantized param
(`TypeError: take requires ndarray`), and the decoding LM head's multiply-and-sum form
(`layers.attend_rows`) is no dot it intercepts; (2) every place a module is applied (decode
models, scorer, verifier) would need the wrapped module; (3) params become Qwix pytree nodes that
the rest of the code (device_put, sharding, memory counts) would have to learn. The two small
classes here cover every quantized tensor with plain arrays in params.
"""

from __future__ import annotations

import re

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

MODES = ("none", "int8")
KERNEL_SCALE = "kernel_scale"
EMBEDDING_SCALE = "embedding_scale"
INT8_MAX = 127
# Scales tried per channel, as fractions of absmax / 127: clipping a channel's few largest
# weights can lower its squared error (SmolLM2-135M's base on 32 held-out prompts, teacher forced:
# top-1 agreement with float32 0.958 at absmax alone, 0.961 searching 0.8-1.0, 0.977 0.7-1.0).
CLIP_RATIOS = tuple(1.0 - 0.025 * i for i in range(13))          # 1.0, 0.975, .., 0.7

# Leaf paths ("/"-joined dict keys) that int8 decoding quantizes; every other leaf stays.
_DENSE = re.compile(r"(^|/)(layers_\d+/(self_attn|mlp)/[a-z]+_proj|lm_head)/kernel$")
_EMBEDDING = re.compile(r"(^|/)embed_tokens/embedding$")


def parse_mode(mode: str | None) -> str | None:
  """"int8" -> "int8"; None or "none" -> None; anything else: ValueError (one line)."""
  if mode is None or mode == "none":
    return None
  if mode not in MODES:
    raise ValueError(f"quantize must be one of {', '.join(MODES)}, got {mode!r}.")
  return mode


def quantize_array(w, axis: int):
  """w [..] float -> (int8 [..] same shape, float32 scale [w.shape[axis]]): symmetric, one scale
  per index of `axis` (the output channel), chosen among CLIP_RATIOS x absmax / 127 (over every
  other axis) for the least squared error of that channel."""
  w = jnp.asarray(w, jnp.float32)
  other = tuple(i for i in range(w.ndim) if i != axis % w.ndim)
  amax = jnp.max(jnp.abs(w), axis=other, keepdims=True)
  best = None
  for ratio in CLIP_RATIOS:
    scale = jnp.where(amax > 0, amax * ratio / INT8_MAX, 1.0)
    q = jnp.clip(jnp.round(w / scale), -INT8_MAX, INT8_MAX)
    err = jnp.sum(jnp.square(q * scale - w), axis=other, keepdims=True)
    if best is None:
      best = (err, q, scale)
    else:
      better = err < best[0]
      best = (jnp.minimum(err, best[0]), jnp.where(better, q, best[1]),
              jnp.where(better, scale, best[2]))
  return best[1].astype(jnp.int8), best[2].reshape(-1).astype(jnp.float32)


_quantize_jit = jax.jit(quantize_array, static_argnums=1)   # compiled once per shape and axis


def dequantize(q, scale, axis: int, dtype=jnp.float32):
  """int8 q [..], scale [q.shape[axis]] -> q * scale in `dtype`."""
  shape = [1] * q.ndim
  shape[axis] = -1
  return (q.astype(jnp.float32) * scale.reshape(shape)).astype(dtype)


def _quantize_dict(tree: dict, prefix: str) -> dict:
  out = {}
  for name, value in tree.items():
    path = f"{prefix}/{name}" if prefix else name
    if isinstance(value, dict):
      out[name] = _quantize_dict(value, path)
    elif getattr(value, "dtype", None) == jnp.int8:        # already quantized
      out[name] = value
    elif _DENSE.search(path) and value.ndim == 2:
      out[name], out[KERNEL_SCALE] = _quantize_jit(value, 1)
    elif _EMBEDDING.search(path) and value.ndim == 2:
      out[name], out[EMBEDDING_SCALE] = _quantize_jit(value, 0)
    elif name not in out:
      out[name] = value
  return out


def quantize_params(params, cfg=None) -> dict:
  """Float params of a HAMburger or Llama model -> the same tree with the decoding matrices int8
  plus their scales (see the module docstring); other leaves are the same arrays. Idempotent.
  cfg (HamburgerConfig or LlamaConfig), if given, checks the embedding's shape."""
  params = flax.core.unfreeze(params)
  if cfg is not None:
    llama = getattr(cfg, "base", cfg)
    base = params.get("base", params)
    table = base.get("embed_tokens", {}).get("embedding")
    if table is not None and tuple(table.shape) != (llama.vocab_size, llama.hidden_size):
      raise ValueError(f"The embedding is {tuple(table.shape)}, the config says "
                       f"{(llama.vocab_size, llama.hidden_size)}.")
  return _quantize_dict(params, "")


def apply_mode(params, cfg, mode: str | None):
  """params quantized as `mode` says ("int8"; None / "none": unchanged); ValueError for another
  mode (see `parse_mode`)."""
  return params if parse_mode(mode) is None else quantize_params(params, cfg)


def is_quantized(params) -> bool:
  """Whether any Dense kernel or embedding of `params` is int8."""
  return any(getattr(x, "dtype", None) == jnp.int8 for x in jax.tree.leaves(params))


def weight_bytes(params) -> int:
  """Bytes of every array in `params` (int8 weights count 1 byte each)."""
  return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(params))


def head_rows(base_params, rows, tied: bool, dtype):
  """The LM head's rows [R, D] in `dtype` for token ids rows [R] (float or int8 params)."""
  if tied:
    embed = base_params["embed_tokens"]
    table = jnp.take(jnp.asarray(embed["embedding"]), rows, axis=0)
    scale = embed.get(EMBEDDING_SCALE)
  else:                                                     # lm_head kernel [D, V]
    head = base_params["lm_head"]
    table = jnp.take(jnp.asarray(head["kernel"]), rows, axis=1).T
    scale = head.get(KERNEL_SCALE)
  if scale is None:
    return table.astype(dtype)
  return dequantize(table, jnp.take(scale, rows), axis=0, dtype=dtype)


class Dense(nn.Dense):
  """nn.Dense that also reads an int8 kernel [in, out] with its "kernel_scale" [out]."""

  @nn.compact
  def __call__(self, inputs):
    if not self.has_variable("params", KERNEL_SCALE):
      return super().__call__(inputs)
    kernel = self.param("kernel", self.kernel_init, (inputs.shape[-1], self.features),
                        self.param_dtype)
    scale = self.get_variable("params", KERNEL_SCALE)
    x = inputs.astype(self.dtype)
    y = jnp.dot(x, kernel.astype(self.dtype)) * scale.astype(self.dtype)
    if self.use_bias:
      y = y + self.param("bias", self.bias_init, (self.features,), self.param_dtype).astype(
          self.dtype)
    return y


class Embed(nn.Embed):
  """nn.Embed that also reads an int8 table [V, D] with its "embedding_scale" [V]."""

  def _scale(self):
    if self.has_variable("params", EMBEDDING_SCALE):
      return self.get_variable("params", EMBEDDING_SCALE)
    return None

  def __call__(self, inputs):
    """tokens [...] int -> [..., D]."""
    scale = self._scale()
    if scale is None:
      return super().__call__(inputs)
    rows = jnp.take(self.embedding, inputs, axis=0).astype(self.dtype)
    return rows * jnp.take(scale, inputs, axis=0)[..., None].astype(self.dtype)

  def attend(self, query):
    """query [..., D] -> [..., V] (the tied LM head)."""
    scale = self._scale()
    if scale is None:
      return super().attend(query)
    out = jnp.dot(query.astype(self.dtype), self.embedding.astype(self.dtype).T)
    return out * scale.astype(self.dtype)

  def head_table(self, dtype):
    """-> (table [V, D] in dtype, per-row scale [V] float32 or None): logits = (h @ table.T) *
    scale; the int8 -> dtype convert is left to fuse into the product."""
    return self.embedding.astype(dtype), self._scale()


def scale_logits(logits, scale):
  """logits [..., V] times a per-row scale [V] (None: unchanged)."""
  return logits if scale is None else logits * scale
