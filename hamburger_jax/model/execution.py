"""How the model computes, not what: attention kernel, rematerialisation, scanned layers.

    ex = Execution(attention="auto", remat="full", scan_layers=True)
    HamburgerModel(cfg, execution=ex)      # same parameters, same numbers, less memory

Every choice gives the same function (up to float rounding); the default (`Execution()`) is the
plain path: XLA attention, nothing rematerialised, layers unrolled.

attention (packed rows without a KV cache; cached decoding uses
  `kv_attention.cached_attention`):
  xla        scores [B, K, G, T, T] in float32, then softmax (small T, CPU tests, decoding).
  blockwise  online softmax over key blocks with a recomputing backward (flash attention in plain
             JAX): never holds a [T, T] tensor; runs on every backend.
  splash     the Pallas TPU splash kernel (causal + segment ids); TPU only, T a multiple of 128.
  cudnn      jax.nn.dot_product_attention's cuDNN kernel (causal + a segment mask); GPU only.
  auto       splash on TPU, cudnn on GPU (16-bit dtypes), blockwise on CPU for T > 1024, else xla.
remat (each base and micro-decoder layer, `jax.checkpoint` policies):
  none         keep every intermediate for the backward pass.
  full         keep only each layer's input; recompute the whole layer in the backward pass.
  save_dots    also keep matmul outputs without batch dims (projections, MLP); recompute the rest
               (`dots_with_no_batch_dims_saveable`, MaxText's "minimal").
  save_inputs  keep the layer input and the normalised inputs of its attention and MLP
               (named `sublayer_input`); recompute everything else.
cache_write (cached forwards):
  in_place   each layer writes its new keys and values into the KV buffers and attends over them.
  returned   the buffers stay as they are: attention overlays the new entries on the key blocks
             it reads (the same numbers as in_place) and each layer returns its new entries
             {"k", "v"} [B, T, K * H] instead of a buffer, for the caller to write. A forward
             inside a lax.cond / lax.switch branch needs it: XLA copies every buffer a branch
             updates in place, twice per step (verified decoding's width branches).
scan_layers: run the base layers as `lax.scan`s over stacked copies of their parameters (runs of
  equal length between feature taps: one scan of scans, ONE compiled layer body) and the micro
  decoder's teacher-forced layers as one scan: compile time flat in depth. The parameter layout
  stays `layers_{i}`, so checkpoints, exports and decoding are the same either way.
"""

from __future__ import annotations

import dataclasses

import jax

ATTENTION_KINDS = ("auto", "xla", "blockwise", "splash", "cudnn")
CACHE_WRITES = ("in_place", "returned")
REMAT_POLICIES = ("none", "full", "save_dots", "save_inputs")
SUBLAYER_INPUT = "sublayer_input"   # checkpoint name of a layer's normalised sublayer inputs


@dataclasses.dataclass(frozen=True)
class Execution:
  attention: str = "xla"
  remat: str = "none"
  scan_layers: bool = False
  attention_block: int = 512     # blockwise: keys per block
  cache_write: str = "in_place"

  def __post_init__(self):
    if self.attention not in ATTENTION_KINDS:
      raise ValueError(f"attention {self.attention!r} is unknown: use one of {ATTENTION_KINDS}.")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"remat policy {self.remat!r} is unknown: use one of {REMAT_POLICIES}.")
    if self.cache_write not in CACHE_WRITES:
      raise ValueError(f"cache_write {self.cache_write!r} is unknown: use one of {CACHE_WRITES}.")
    if self.attention_block < 1:
      raise ValueError(f"attention_block must be >= 1, got {self.attention_block}.")


def remat_policy(name: str):
  """A `jax.checkpoint` policy for a REMAT_POLICIES name ('none' -> None: no checkpoint at all)."""
  policies = jax.checkpoint_policies
  return {"none": None,
          "full": policies.nothing_saveable,
          "save_dots": policies.dots_with_no_batch_dims_saveable,
          "save_inputs": policies.save_only_these_names(SUBLAYER_INPUT)}[name]
