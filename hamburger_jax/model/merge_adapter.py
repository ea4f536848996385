"""Merge adapter: a small residual MLP after each base layer, active only at merged inputs.

The frozen base model never saw an input that stands for several tokens. At macro positions whose
group holds >= 2 tokens, the output of base layer i gets

    up_i(silu(down_i(rmsnorm_i(x_in))))        x_in [B, T, D] = the layer's input, rank r

added (`up_i` starts at zero, so a fresh adapter changes nothing). Positions fed a single token
are left exactly as the base computes them: a decode that emits one token per macro step is
still the base model, token for token. `HamburgerConfig.merge_adapter_rank` = r (0 = none).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from hamburger_jax.model.config import HamburgerConfig
from hamburger_jax.model.layers import RMSNorm, dense, logical
from hamburger_jax.model.quantize import Dense


class AdapterLayer(nn.Module):
  """x_in [..., D] -> the residual delta [..., D] of one base layer."""
  cfg: HamburgerConfig

  @nn.compact
  def __call__(self, x_in):
    base, r = self.cfg.base, self.cfg.merge_adapter_rank
    h = RMSNorm(base.rms_norm_eps, base.jnp_dtype, base.jnp_param_dtype, name="norm")(x_in)
    h = nn.silu(dense(r, ("embed", "mlp"), base, "down")(h))
    return Dense(base.hidden_size, use_bias=False, dtype=base.jnp_dtype,
                 param_dtype=base.jnp_param_dtype, name="up",
                 kernel_init=logical(nn.initializers.zeros_init(), ("mlp", "embed")))(h)


class MergeAdapter(nn.Module):
  """One `AdapterLayer` per base layer (`layers_0 ..`)."""
  cfg: HamburgerConfig

  def setup(self):
    self.layers = [AdapterLayer(self.cfg, name=f"layers_{i}")
                   for i in range(self.cfg.base.num_layers)]

  def __call__(self, i: int, x_in, x_out, merged, skip_unmerged: bool = False):
    """Layer i's output x_out [B, T, D] plus the delta where merged [B, T] (bool) is set.

    skip_unmerged (static): compute nothing when no input is merged (a branch; the same result).
    """
    if not skip_unmerged:
      return _add_delta(self.layers[i], x_in, x_out, merged)
    return nn.cond(jnp.any(merged), _add_delta, lambda _, x_in, x_out, merged: x_out,
                   self.layers[i], x_in, x_out, merged)


def _add_delta(layer, x_in, x_out, merged):
  delta = layer(x_in)
  return jnp.where(merged[..., None], x_out + delta.astype(x_out.dtype), x_out)
