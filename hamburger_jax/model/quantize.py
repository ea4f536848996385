"""int8 weight-only decoding: symmetric int8 weights, scaled inside the matmul.

    qparams = quantize_params(params, cfg)      # once, at load; HAMburger or Llama params
    Sampler(cfg, params, quantize="int8")       # the same, inside the sampler
    Sampler(cfg, params, quantize="int8:64")    # one scale per 64 inputs of each output channel
    Sampler(cfg, params, verify=True, quantize="micro:int8")   # the drafter alone

A quantized Dense holds {"kernel": int8 [in, out], "kernel_scale": float32 [out]} and computes
(x @ kernel) * scale, the int8 -> float convert feeding the dot (XLA's TPU backend fuses it; its
CPU backend writes the converted kernel out first, so on CPU int8 saves memory, not time). The
token embedding holds {"embedding": int8 [V, D], "embedding_scale": float32 [V]}: a lookup
scales the gathered int8 rows, and the tied LM head scales its logits by the same per-row scale.
`Dense` and `Embed` below read both layouts (two compile keys of one program).

Group-wise scales (mode "int8:G"): one scale per group of G consecutive entries along the
contracted dimension: a Dense's "kernel_scale" is [in/G, out], y = sum_g (x_g @ kernel_g) *
scale[g] (one einsum, then the scaled sum); the embedding's is [V, D/G], the tied head summing
the groups' partial products (`int8_table.grouped_logits`). G must divide every quantized
tensor's contracted width. On a TPU an int8 table is stored in blocks of 32 rows (`int8_table`).

Zero points (mode "int8:Gz"): Dense kernels asymmetric per group, {"kernel": int8,
"kernel_scale", "kernel_zero": float32 [in/G, out]}, w = q * scale + zero with the group's
min..max in 256 levels; y = sum_g (x_g @ kernel_g) * scale[g] + sum(x_g) * zero[g]. Weights that
came from a 4-bit format with a scale and a minimum per block (GGUF's Q4_1, blocks of 32 inputs:
SmolLM2's shipped base) round-trip exactly at G = 32, since their 16 levels are 17 of these 256
apart. The embedding keeps symmetric group scales (GGUF's Q8_0 blocks round-trip exactly too).

Quantized: the q/k/v/o/gate/up/down kernels (base and micro decoder), the LM head or the tied
embedding. Left in float: norms, biases, the embedder, the merge adapter, the stop head.

The drafter alone ("micro:<mode>"): the micro decoder's kernels and a draft vocabulary's head
rows (a scale per row) in int8, the base as given: verified decoding still commits the base's
own tokens, its drafting micro steps reading half the bytes on an accelerator.

Scale (symmetric): of r x absmax / 127, r in CLIP_RATIOS, the one with the least squared error
over the channel (group); all-zero: 1. Why not Qwix: docs/architecture.md, "int8 weights".
"""

from __future__ import annotations

import math
import re

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.model import int8_table
from hamburger_jax.model.stored_params import stored_param

MODES = ("none", "int8", "int8:G", "int8:Gz", "micro:<mode>")
MICRO = "micro:"          # "micro:int8": the drafter's weights only (`quantize_drafter`)
KERNEL_SCALE = "kernel_scale"
KERNEL_ZERO = "kernel_zero"
EMBEDDING_SCALE = "embedding_scale"
DRAFT_TABLE_SCALE = "table_scale"
INT8_MAX = 127
# Scales tried per channel, as fractions of absmax / 127: clipping a channel's few largest
# weights can lower its squared error (SmolLM2-135M's base on 32 held-out prompts, teacher forced:
# top-1 agreement with float32 0.958 at absmax alone, 0.961 searching 0.8-1.0, 0.977 0.7-1.0).
CLIP_RATIOS = tuple(1.0 - 0.025 * i for i in range(13))          # 1.0, 0.975, .., 0.7

# Leaf paths ("/"-joined dict keys) that int8 decoding quantizes; every other leaf stays.
_DENSE = re.compile(r"(^|/)(layers_\d+/(self_attn|mlp)/[a-z]+_proj|lm_head)/kernel$")
_EMBEDDING = re.compile(r"(^|/)embed_tokens/embedding$")
_GROUPED = re.compile(r"int8:([1-9][0-9]*)(z?)")


class QuantizeError(ValueError):
  """A quantize mode decoding does not know, or a group size the weights' widths refuse."""


def parse_mode(mode: str | None) -> str | None:
  """"int8", "int8:G" or "int8:Gz" (G >= 1), each also as "micro:<mode>" -> the mode; None or
  "none" -> None; anything else: QuantizeError (one line)."""
  if mode is None or mode == "none":
    return None
  inner = mode[len(MICRO):] if isinstance(mode, str) and mode.startswith(MICRO) else mode
  if inner != "int8" and not (isinstance(inner, str) and _GROUPED.fullmatch(inner)):
    raise QuantizeError(f"quantize must be one of {', '.join(MODES)} (G: a group size along "
                        f"the input width, e.g. int8:64; z: a zero point per group; micro: the "
                        f"drafter's weights only, e.g. micro:int8), got {mode!r}.")
  return mode


def drafter_only(mode: str | None) -> bool:
  """Whether `mode` ("micro:<mode>") quantizes the drafter alone (`quantize_drafter`)."""
  return (parse_mode(mode) or "").startswith(MICRO)


def _grouped(mode: str | None):                     # "int8:G(z)", also after "micro:"
  return _GROUPED.fullmatch((parse_mode(mode) or "").removeprefix(MICRO))


def group_size(mode: str | None) -> int | None:
  """The G of "int8:G" / "int8:Gz" (also after "micro:"), else None (QuantizeError: no mode)."""
  match = _grouped(mode)
  return int(match.group(1)) if match else None


def has_zero(mode: str | None) -> bool:
  """Whether `mode` ("int8:Gz") gives Dense kernels a zero point per group."""
  return bool((match := _grouped(mode)) and match.group(2))


def _min_max_zero(w, reduce: tuple[int, ...]):
  """w float32 -> (q in -128..127 float32, scale, zero), w ~ q * scale + zero: the 256 levels
  span each group's [min, max] (keepdims, as `_best_scale`)."""
  lo, hi = jnp.min(w, axis=reduce, keepdims=True), jnp.max(w, axis=reduce, keepdims=True)
  scale = jnp.where(hi > lo, (hi - lo) / 255.0, 1.0)
  q = jnp.clip(jnp.round((w - lo) / scale), 0, 255) - 128.0
  return q, scale, lo + 128.0 * scale


def _best_scale(w, reduce: tuple[int, ...]):
  """w float32 -> (rounded w / scale float32, scale), one scale per index of the axes not in
  `reduce` (kept as size-1 dims): the CLIP_RATIOS x absmax / 127 with the least squared error."""
  amax = jnp.max(jnp.abs(w), axis=reduce, keepdims=True)
  best = None
  for ratio in CLIP_RATIOS:
    scale = jnp.where(amax > 0, amax * ratio / INT8_MAX, 1.0)
    q = jnp.clip(jnp.round(w / scale), -INT8_MAX, INT8_MAX)
    err = jnp.sum(jnp.square(q * scale - w), axis=reduce, keepdims=True)
    if best is None:
      best = (err, q, scale)
    else:
      better = err < best[0]
      best = (jnp.minimum(err, best[0]), jnp.where(better, q, best[1]),
              jnp.where(better, scale, best[2]))
  return best[1], best[2]


def quantize_array(w, axis: int, group: int | None = None, zero: bool = False):
  """w [..] float -> (int8 [..] same shape, float32 scale): symmetric, chosen among CLIP_RATIOS x
  absmax / 127 for the least squared error.

  group None: one scale per index of `axis` (the output channel), over every other axis: scale
  [w.shape[axis]]. group G (w 2-D): one per output channel and group of G consecutive entries
  of the other (contracted) axis c: scale [in/G, out] for axis 1, [V, D/G] for axis 0.
  zero (with a group): asymmetric, the group's min..max in 256 levels -> (int8, scale, zero
  [like scale]), w ~ q * scale + zero.
  """
  w = jnp.asarray(w, jnp.float32)
  if group is None:
    other = tuple(i for i in range(w.ndim) if i != axis % w.ndim)
    q, scale = _best_scale(w, other)
    return q.astype(jnp.int8), scale.reshape(-1).astype(jnp.float32)
  c = 1 - axis % 2                                               # the contracted axis
  if w.ndim != 2 or w.shape[c] % group:
    raise QuantizeError(f"int8:{group} needs a 2-D weight whose contracted width "
                        f"({w.shape[c] if w.ndim == 2 else w.shape}) G divides.")
  grouped = w.reshape(w.shape[:c] + (w.shape[c] // group, group) + w.shape[c + 1:])
  if zero:
    q, scale, low = _min_max_zero(grouped, (c + 1,))
    return (q.reshape(w.shape).astype(jnp.int8), jnp.squeeze(scale, c + 1).astype(jnp.float32),
            jnp.squeeze(low, c + 1).astype(jnp.float32))
  q, scale = _best_scale(grouped, (c + 1,))
  return q.reshape(w.shape).astype(jnp.int8), jnp.squeeze(scale, c + 1).astype(jnp.float32)


_quantize_jit = jax.jit(quantize_array, static_argnums=(1, 2, 3))   # once per shape, axis, mode


def dequantize(q, scale, axis: int, dtype=jnp.float32, zero=None):
  """int8 q [..] and its scale (and zero, like scale) -> q * scale (+ zero) in `dtype`. scale:
  [q.shape[axis]] (per channel) or, q 2-D, grouped along the other axis ([in/G, out] for axis
  1, [V, D/G] for axis 0)."""
  if scale.ndim == 1:
    shape = [1] * q.ndim
    shape[axis] = -1
    return (q.astype(jnp.float32) * scale.reshape(shape)).astype(dtype)
  c = 1 - axis % 2
  full = jnp.repeat(scale, q.shape[c] // scale.shape[c], axis=c)
  out = q.astype(jnp.float32) * full
  if zero is not None:
    out = out + jnp.repeat(zero, q.shape[c] // zero.shape[c], axis=c)
  return out.astype(dtype)


def _targets(tree: dict, prefix: str = ""):
  """-> (path, leaf, channel axis) of every float leaf int8 decoding quantizes."""
  for name, value in tree.items():
    path = f"{prefix}/{name}" if prefix else name
    if isinstance(value, dict):
      yield from _targets(value, path)
    elif getattr(value, "dtype", None) == jnp.int8 or getattr(value, "ndim", 0) != 2:
      continue
    elif _DENSE.search(path):
      yield path, value, 1
    elif _EMBEDDING.search(path):
      yield path, value, 0


def check_group(params, group: int) -> None:
  """QuantizeError (one line, naming a G that fits) unless `group` divides the contracted width
  of every tensor int8 decoding quantizes in params."""
  widths = {path: (v.shape[1 - axis], tuple(v.shape)) for path, v, axis in _targets(params)}
  common = math.gcd(*(w for w, _ in widths.values())) if widths else group
  for path, (width, shape) in widths.items():
    if width % group:
      fit = max((d for d in range(1, min(group, common) + 1) if common % d == 0), default=1)
      raise QuantizeError(
          f"quantize int8:{group}: G={group} does not divide {width}, the contracted width of "
          f"{path} {list(shape)}; use a G that divides {common}, e.g. int8:{fit}.")


def _quantize_dict(tree: dict, prefix: str, group: int | None, zero: bool = False) -> dict:
  out = {}
  for name, value in tree.items():
    path = f"{prefix}/{name}" if prefix else name
    if isinstance(value, dict):
      out[name] = _quantize_dict(value, path, group, zero)
    elif getattr(value, "dtype", None) == jnp.int8:        # already quantized
      out[name] = value
    elif _DENSE.search(path) and value.ndim == 2 and zero:
      out[name], out[KERNEL_SCALE], out[KERNEL_ZERO] = _quantize_jit(value, 1, group, True)
    elif _DENSE.search(path) and value.ndim == 2:
      out[name], out[KERNEL_SCALE] = _quantize_jit(value, 1, group)
    elif _EMBEDDING.search(path) and value.ndim == 2:
      out[name], out[EMBEDDING_SCALE] = _quantize_jit(value, 0, group)
    elif name not in out:
      out[name] = value
  return out


def quantize_params(params, cfg=None, group: int | None = None, zero: bool = False) -> dict:
  """Float params of a HAMburger or Llama model -> the same tree with the decoding matrices int8
  plus their scales (see the module docstring); other leaves are the same arrays. Idempotent.
  group: None = per-channel scales, G = "int8:G" (QuantizeError, before any work, if G does not
  divide a contracted width); zero (with a group): Dense kernels asymmetric ("int8:Gz"; the
  embedding keeps symmetric group scales). cfg (HamburgerConfig or LlamaConfig), if given, checks
  the embedding's shape."""
  params = flax.core.unfreeze(params)
  if cfg is not None:
    llama = getattr(cfg, "base", cfg)
    base = params.get("base", params)
    table = base.get("embed_tokens", {}).get("embedding")
    if table is not None and tuple(int8_table.flat(table).shape) != (llama.vocab_size,
                                                                  llama.hidden_size):
      raise ValueError(f"The embedding is {tuple(table.shape)}, the config says "
                       f"{(llama.vocab_size, llama.hidden_size)}.")
  if group is not None:
    check_group(params, group)
  return _quantize_dict(params, "", group, zero and group is not None)


def apply_mode(params, cfg, mode: str | None, blocks: bool | None = None):
  """params quantized as `mode` says ("int8", "int8:G"; None / "none": unchanged);
  QuantizeError for another mode (see `parse_mode`) or a G the widths refuse. blocks: store int8
  embedding tables as blocks of 32 rows (`int8_table`; None: where JAX's default backend is a
  TPU)."""
  if parse_mode(mode) is None:
    return params
  if drafter_only(mode):
    return quantize_drafter(params, group_size(mode), has_zero(mode))
  out = quantize_params(params, cfg, group_size(mode), has_zero(mode))
  if jax.default_backend() == "tpu" if blocks is None else blocks:
    return int8_table.block_tables(out)
  return out


def quantize_drafter(params, group: int | None = None, zero: bool = False) -> dict:
  """HAMburger params -> the same tree with only what drafts read quantized: the micro decoder's
  Dense kernels (as `quantize_params`) and a draft vocabulary's head rows (`quantize_draft_rows`).
  The base and the embedder stay as given, so verified decoding still commits the base's own
  tokens. Params without a micro decoder (a plain Llama) come back unchanged."""
  if "micro_decoder" not in params:
    return params
  params = flax.core.unfreeze(params)
  micro = {"micro_decoder": params["micro_decoder"]}
  if group is not None:
    check_group(micro, group)
  out = {**params, **_quantize_dict(micro, "", group, zero and group is not None)}
  if "draft" in params:
    out["draft"] = quantize_draft_rows(params["draft"])
  return out


def quantize_draft_rows(draft: dict) -> dict:
  """A draft vocabulary's params, the table [K + R, D] int8 with a DRAFT_TABLE_SCALE [K + R]."""
  if getattr(draft["table"], "dtype", None) == jnp.int8:
    return draft
  table, scale = _quantize_jit(draft["table"], 0, None)
  return {**draft, "table": table, DRAFT_TABLE_SCALE: scale}


def is_quantized(params) -> bool:
  """Whether any Dense kernel or embedding of `params` is int8."""
  return any(getattr(x, "dtype", None) == jnp.int8 for x in jax.tree.leaves(params))


def weight_bytes(params) -> int:
  """Bytes of every array in `params`, scales included (int8 weights count 1 byte each)."""
  return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(params))


def head_rows(base_params, rows, tied: bool, dtype):
  """The LM head's rows [R, D] in `dtype` for token ids rows [R] (float or int8 params, scales
  per channel or grouped)."""
  zero = None                                              # zero points: Dense kernels only
  if tied:
    embed = base_params["embed_tokens"]
    table = int8_table.take(jnp.asarray(embed["embedding"]), rows)
    scale = embed.get(EMBEDDING_SCALE)
    scale = None if scale is None else jnp.take(scale, rows, axis=0)          # [R] or [R, n]
  else:                                                     # lm_head kernel [D, V]
    head = base_params["lm_head"]
    table = jnp.take(jnp.asarray(head["kernel"]), rows, axis=1).T
    scale = head.get(KERNEL_SCALE)
    scale = None if scale is None else jnp.take(scale, rows, axis=-1).T       # [R] or [R, n]
    zero = head.get(KERNEL_ZERO)
    zero = None if zero is None else jnp.take(zero, rows, axis=-1).T          # [R, n]
  if scale is None:
    return table.astype(dtype)
  return dequantize(table, scale, axis=0, dtype=dtype, zero=zero)


class Dense(nn.Dense):
  """nn.Dense (kernel [in, out], optional bias) that also reads an int8 kernel with its
  "kernel_scale": [out] (per channel) or [in/G, out] (groups of G inputs). Given parameters are
  read with `stored_param` (no initializer traced per apply)."""

  @nn.compact
  def __call__(self, inputs):
    kernel = stored_param(self, "kernel", self.kernel_init, (inputs.shape[-1], self.features),
                          self.param_dtype)
    bias = None
    if self.use_bias:
      bias = stored_param(self, "bias", self.bias_init, (self.features,), self.param_dtype)
    if not self.has_variable("params", KERNEL_SCALE):            # nn.Dense's computation
      inputs, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
      dot_general = (self.dot_general_cls() if self.dot_general_cls is not None
                     else self.dot_general or jax.lax.dot_general)
      y = dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())),
                      precision=self.precision)
      return y if bias is None else y + jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))
    scale = self.get_variable("params", KERNEL_SCALE)
    x = inputs.astype(self.dtype)
    if scale.ndim == 1:
      y = jnp.dot(x, kernel.astype(self.dtype)) * scale.astype(self.dtype)
    else:                                                   # x [.., n, G], kernel [n, G, out]
      n = scale.shape[0]
      parts = jnp.einsum("...ng,ngo->...no", x.reshape(x.shape[:-1] + (n, -1)),
                         kernel.astype(self.dtype).reshape(n, -1, self.features))
      y = jnp.sum(parts * scale.astype(self.dtype), axis=-2)
      if self.has_variable("params", KERNEL_ZERO):          # + sum_g zero[g] * sum(x_g)
        x_sums = jnp.sum(x.reshape(x.shape[:-1] + (n, -1)), axis=-1)
        y = y + jnp.dot(x_sums, self.get_variable("params", KERNEL_ZERO).astype(self.dtype))
    if bias is not None:
      y = y + bias.astype(self.dtype)
    return y


class Embed(nn.Embed):
  """nn.Embed that also reads an int8 table [V, D] (or its blocks [V/32, 32, D], on a TPU:
  `int8_table`) with its "embedding_scale": [V] (per row) or [V, D/G] (per row and group of G)."""

  def setup(self):
    if self.has_variable("params", "embedding") and int8_table.is_blocked(
        self.get_variable("params", "embedding")):
      self.embedding = self.get_variable("params", "embedding")   # not nn.Embed's [V, D] shape
    else:
      self.embedding = stored_param(self, "embedding", self.embedding_init,
                                    (self.num_embeddings, self.features), self.param_dtype)

  def _scale(self):
    if self.has_variable("params", EMBEDDING_SCALE):
      return self.get_variable("params", EMBEDDING_SCALE)
    return None

  def is_grouped(self) -> bool:
    """Whether the table is int8 with group-wise scales [V, D/G]."""
    scale = self._scale()
    return scale is not None and scale.ndim == 2

  def __call__(self, inputs):
    """tokens [...] int -> [..., D]."""
    scale = self._scale()
    if scale is None:
      return super().__call__(inputs)
    rows = int8_table.take(self.embedding, inputs).astype(self.dtype)
    scale = jnp.take(scale, inputs, axis=0).astype(self.dtype)          # [...] or [..., n]
    if scale.ndim == rows.ndim - 1:
      return rows * scale[..., None]
    grouped = rows.reshape(rows.shape[:-1] + (scale.shape[-1], -1)) * scale[..., None]
    return grouped.reshape(rows.shape)

  def attend(self, query):
    """query [..., D] -> [..., V] (the tied LM head)."""
    scale = self._scale()
    if scale is None:
      return super().attend(query)
    if scale.ndim == 2:
      return int8_table.grouped_logits(query, self.embedding, scale, self.dtype)
    table = int8_table.flat(self.embedding)
    out = jnp.dot(query.astype(self.dtype), table.astype(self.dtype).T)
    return out * scale.astype(self.dtype)

  def head_table(self, dtype):
    """-> (table [V, D] in dtype, per-row scale [V] float32 or None): logits = (h @ table.T) *
    scale; the int8 -> dtype convert is left to fuse into the product. Not for grouped scales
    (`is_grouped`: `attend` sums the groups' partial products)."""
    return int8_table.flat(self.embedding).astype(dtype), self._scale()


def scale_logits(logits, scale):
  """logits [..., V] times a per-row scale [V] (None: unchanged)."""
  return logits if scale is None else logits * scale
