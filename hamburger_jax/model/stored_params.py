"""Parameter lookup for applies: a parameter that is already given is used as it is.

    kernel = stored_param(self, "kernel", self.kernel_init, (d_in, d_out), self.param_dtype)

Flax's `Module.param` checks a given parameter's shape by tracing its initializer (one
`eval_shape` per parameter each time a program is traced: a decode loop or a train step reads
every layer's parameters several times). `stored_param` compares the shape directly, with Flax's
error for a mismatch. At init, or for a parameter that is not given, it is `Module.param`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
from flax import errors
from flax.core import meta


def stored_param(module: nn.Module, name: str, init_fn: Callable, shape: Sequence[int], dtype):
  """The parameter `name` of `module` (unboxed), created by `init_fn(key, shape, dtype)` at init."""
  if module.is_initializing() or not module.has_variable("params", name):
    return module.param(name, init_fn, shape, dtype)
  value = meta.unbox(module.get_variable("params", name))
  if tuple(value.shape) != tuple(shape):
    raise errors.ScopeParamShapeError(name, module.scope.path_text, tuple(value.shape),
                                      tuple(shape))
  return value
