"""Llama building blocks: RMSNorm, RoPE (explicit positions, Llama-3 scaling), SwiGLU MLP.

Every parameter carries logical axis names (`embed`, `mlp`, `heads`, `kv_heads`, `vocab`, `norm`)
so that sharding rules in the experiment config can map them onto a device mesh.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.model import cpu_dots
from hamburger_jax.model import partitioning as pt
from hamburger_jax.model.config import LlamaConfig, RopeScaling
from hamburger_jax.model.quantize import Dense
from hamburger_jax.model.stored_params import stored_param

default_init = nn.initializers.normal(stddev=0.02)


def logical(init, axes):
  return nn.with_logical_partitioning(init, axes)


def dense(features: int, axes: tuple[str, str], cfg: LlamaConfig, name: str,
          use_bias: bool = False, bias_axis: str | None = None) -> nn.Dense:
  """A Dense layer (kernel [in, out]) with logical axis names and the config's dtypes (it also
  reads an int8 kernel with its scale: `hamburger_jax.model.quantize`)."""
  kwargs = {}
  if use_bias:
    kwargs["bias_init"] = logical(nn.initializers.zeros_init(), (bias_axis or axes[1],))
  return Dense(features, use_bias=use_bias, dtype=cfg.jnp_dtype,
               param_dtype=cfg.jnp_param_dtype, kernel_init=logical(default_init, axes),
               name=name, **kwargs)


# XLA's CPU dot packs the whole right-hand matrix before a product, so a few rows times a large
# [V, D] table (a tied LM head) cost about what 32 rows do. A multiply and a sum over D reads the
# table once instead; these row counts are where it was measured faster than the dot, and other
# row counts keep the dot. The gain depends on the CPU (docs/results/step_costs.md).
FEW_ROWS = (2, 4, 8, 16, 32)
# With YNNPACK's dot fusions off and its reduce fusions kept (`cpu_dots` "plain"), a multiply and
# sum over D is one YNNPACK reduction, measured faster than the dot from 2 rows to this many.
PLAIN_SUM_MAX_ROWS = 64


def attend_rows(hidden, table):
  """hidden [R, D] times table [V, D] (one dtype) -> [R, V] float32 (= hidden @ table.T, in the
  form that is fastest for R rows on a CPU in float32: a multiply and sum over D, R in FEW_ROWS
  with XLA's default fusions, 2 <= R <= PLAIN_SUM_MAX_ROWS with plain dots; else a dot)."""
  rows = hidden.shape[0] if hidden.ndim == 2 else 0
  if jax.default_backend() == "cpu" and hidden.dtype == table.dtype == jnp.float32:
    few = (1 < rows <= PLAIN_SUM_MAX_ROWS) if cpu_dots.tracing_plain() else rows in FEW_ROWS
    if few:
      return jnp.sum(table[None] * hidden[:, None, :], axis=-1)
  return jnp.dot(hidden, table.T).astype(jnp.float32)


class RMSNorm(nn.Module):
  """y = x / rms(x) * scale, computed in float32 (HF `LlamaRMSNorm`)."""
  eps: float
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    scale = stored_param(self, "scale", logical(nn.initializers.ones_init(), ("norm",)),
                         (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return scale.astype(self.dtype) * x32.astype(self.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
  """Inverse frequencies [head_dim // 2] of RoPE, with Llama-3 scaling if given (float32)."""
  inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
  if scaling is not None:
    old = scaling.original_max_position_embeddings
    low_wavelen = old / scaling.low_freq_factor
    high_wavelen = old / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    inv_freq = np.where(medium, smoothed, scaled)
  return inv_freq.astype(np.float32)


def apply_rope(x, positions, inv_freq):
  """Rotates x [B, T, N, H] by positions [B, T] (HF "rotate-half" layout)."""
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, H/2]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


class SwiGLU(nn.Module):
  """down(silu(gate(x)) * up(x))."""
  cfg: LlamaConfig

  @nn.compact
  def __call__(self, x):
    c = self.cfg
    gate = dense(c.intermediate_size, ("embed", "mlp"), c, "gate_proj")(x)
    up = dense(c.intermediate_size, ("embed", "mlp"), c, "up_proj")(x)
    hidden = pt.constrain(nn.silu(gate) * up, (pt.BATCH, pt.LENGTH, pt.MLP))
    return dense(c.hidden_size, ("mlp", "embed"), c, "down_proj")(hidden)
