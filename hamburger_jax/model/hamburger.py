"""HamburgerModel: compositional embedder -> base Llama -> micro-step decoder.

Parameters: {"base": Llama params, "embedder": merge weights, "micro_decoder": layers + stop head,
and with cfg.merge_adapter_rank > 0 "merge_adapter": base-layer adapters at merged inputs}.
The embedder and the LM head share the base model's token embedding.

Training (teacher forcing, see `hamburger_jax.model.batch` for the batch fields):
    out = HamburgerModel(cfg).apply({"params": p}, batch)
    out.logits [B, M, S, V], out.stop_logits [B, M, S]
The training loss calls the two halves, `base_features` and then `micro_outputs` + `heads` on
chunks of positions (hamburger_jax.train.losses), so that no [B, M, S, V] tensor is built.
Decoding uses the methods `embed_groups`, `base_forward`, `micro_prefill`, `micro_step`, `heads`
(verified decoding: `unmerged_forward`, `micro_prefill_step`).
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from hamburger_jax.model.config import HamburgerConfig
from hamburger_jax.model.embedder import CompositionalEmbedder
from hamburger_jax.model.execution import Execution
from hamburger_jax.model.llama import LlamaModel, LlamaOutput
from hamburger_jax.model.merge_adapter import MergeAdapter
from hamburger_jax.model.micro_decoder import MicroStepDecoder


class TrainOutput(NamedTuple):
  logits: jax.Array        # [B, M, S, V] float32: micro step j predicts token j of the next group
  stop_logits: jax.Array   # [B, M, S] float32
  embeddings: jax.Array    # [B, M, D] merged inputs of the base model
  features: jax.Array      # [B, M, F, D] base features at each macro position
  micro_outputs: jax.Array  # [B, M, S, D] micro-step vectors (before the heads)
  target_tokens: jax.Array  # [B, M, S] the targets the logits line up with
  target_lengths: jax.Array  # [B, M]


def gather_target_positions(batch: Mapping[str, Any], max_targets: int):
  """Indices [B, K] of the first K macro positions that have a target, in order.

  Rows with fewer targets are padded with positions whose target length is 0; targets past the
  K-th of a row are dropped (size K from the data: the most groups a packed row can hold).
  """
  has_target = batch["target_lengths"] > 0
  order = jnp.argsort(~has_target, axis=1, stable=True)
  return order[:, :max_targets]


class HamburgerModel(nn.Module):
  cfg: HamburgerConfig
  execution: Execution = Execution()   # attention kernel, remat, scan (same numbers)

  def setup(self):
    self.base = LlamaModel(self.cfg.base, self.execution)
    self.embedder = CompositionalEmbedder(self.cfg)
    self.micro_decoder = MicroStepDecoder(self.cfg, self.execution)
    self.merge_adapter = MergeAdapter(self.cfg) if self.cfg.merge_adapter_rank else None

  # --- pieces shared by training and decoding -------------------------------------------------

  def embed_groups(self, group_tokens, group_lengths, skip_unmerged: bool = False):
    """group_tokens [..., S], group_lengths [...] -> merged input embeddings [..., D]."""
    return self.embedder(self.base.embed(group_tokens), group_lengths, skip_unmerged)

  def adapter_hook(self, group_lengths, skip_unmerged: bool = False):
    """The base layers' hook for inputs of these group lengths [B, T] (None without adapter);
    skip_unmerged: see `MergeAdapter.__call__`."""
    if self.merge_adapter is None:
      return None
    merged = group_lengths > 1
    return lambda i, x_in, x_out: self.merge_adapter(i, x_in, x_out, merged, skip_unmerged)

  def base_forward(self, group_tokens, group_lengths, positions, segment_ids=None, cache=None,
                   cache_slots=None, return_logits: bool = False,
                   skip_unmerged: bool = False) -> LlamaOutput:
    """Base model over merged inputs [B, T, S] (+ lengths [B, T]); features [B, T, F, D].
    skip_unmerged: when no input is merged, the embedder's merge and the merge adapter compute
    nothing (decoding; the same result)."""
    x = self.embed_groups(group_tokens, group_lengths, skip_unmerged)
    return self.base(embeddings=x, positions=positions, segment_ids=segment_ids, cache=cache,
                     cache_slots=cache_slots, feature_layers=self.cfg.feature_layers,
                     return_logits=return_logits,
                     layer_hook=self.adapter_hook(group_lengths, skip_unmerged))

  def unmerged_forward(self, tokens, positions, cache, cache_slots,
                       block_mask=None) -> LlamaOutput:
    """The base over plain tokens [B, T] (no input merged: no embedder merge, no merge adapter),
    one KV slot each; features [B, T, F, D] (verified decoding). block_mask [T, T]: the inputs
    are a draft tree (`LlamaModel.__call__`)."""
    return self.base(tokens, positions=positions, cache=cache, cache_slots=cache_slots,
                     feature_layers=self.cfg.feature_layers, return_logits=False,
                     block_mask=block_mask)

  def heads(self, hidden, decoding: bool = False):
    """Micro outputs [..., D] -> (logits [..., V], stop logits [...]), both float32.
    decoding: hidden is [B, D] of one decode step (`LlamaModel.logits`)."""
    return self.base.logits(hidden, decoding=decoding), self.micro_decoder.stop(hidden)

  # --- decoding ---------------------------------------------------------------------------------

  def stop(self, hidden):
    """Micro outputs [..., D] -> stop logits [...] float32 (the stop head alone)."""
    return self.micro_decoder.stop(hidden)

  def micro_prefill(self, features):
    """features [B, F, D] -> a fresh micro-decoder KV cache holding the features."""
    return self.micro_decoder.prefill(features)

  def micro_prefill_step(self, features, first_tokens):
    """features [B, F, D], step 0's tokens [B] -> (micro step 1's out [B, D], cache): the micro
    prefill and step 1 in one pass (`MicroStepDecoder.prefill_step`)."""
    return self.micro_decoder.prefill_step(features, self.base.embed(first_tokens))

  def micro_step(self, prev_tokens, step, cache):
    """Micro step `step` >= 1 given the previous micro step's tokens [B] -> (out [B, D], cache)."""
    return self.micro_decoder.step(self.base.embed(prev_tokens), step, cache)

  # --- training ---------------------------------------------------------------------------------

  def base_features(self, batch: Mapping[str, Any], max_targets: int | None = None):
    """Embedder + base model over a packed batch -> (embeddings [B, M, D], features [B, K, F, D],
    target tokens [B, K, S], target lengths [B, K]); K = M, or `max_targets` (see __call__)."""
    embeddings = self.embed_groups(batch["group_tokens"], batch["group_lengths"])
    out = self.base(embeddings=embeddings, positions=batch["positions"],
                    segment_ids=batch["segment_ids"], feature_layers=self.cfg.feature_layers,
                    return_logits=False, layer_hook=self.adapter_hook(batch["group_lengths"]))
    features = out.features
    targets, lengths = batch["target_tokens"], batch["target_lengths"]
    if max_targets is not None:
      idx = gather_target_positions(batch, max_targets)
      features = jnp.take_along_axis(features, idx[:, :, None, None], axis=1)
      targets = jnp.take_along_axis(targets, idx[:, :, None], axis=1)
      lengths = jnp.take_along_axis(lengths, idx, axis=1)
    return embeddings, features, targets, lengths

  def micro_outputs(self, features, targets):
    """Teacher-forced micro decoder: features [B, K, F, D], targets [B, K, S] -> [B, K, S, D]."""
    s = self.cfg.max_steps
    b, m, f, d = features.shape
    teacher = self.base.embed(targets[..., :s - 1])                      # [B, K, S-1, D]
    micro = self.micro_decoder.teacher_forced(features.reshape(b * m, f, d),
                                              teacher.reshape(b * m, s - 1, d))
    return micro.reshape(b, m, s, d)

  def __call__(self, batch: Mapping[str, Any], max_targets: int | None = None) -> TrainOutput:
    """Teacher-forced forward over a packed batch (fields of `hamburger_jax.model.batch`).

    With `max_targets` = K (static), the micro decoder and the heads run only on the first K
    positions of each row that have a target (prompt positions predict nothing), so the outputs
    are [B, K, ...] and `target_tokens` / `target_lengths` are gathered to match.
    """
    embeddings, features, targets, lengths = self.base_features(batch, max_targets)
    micro = self.micro_outputs(features, targets)
    logits, stops = self.heads(micro)
    return TrainOutput(logits, stops, embeddings, features, micro, targets, lengths)


def dummy_batch(cfg: HamburgerConfig, rows: int = 1, length: int = 2) -> dict[str, jax.Array]:
  """A zero batch of the training format (for init and eval_shape)."""
  s = cfg.max_steps
  z2 = jnp.zeros((rows, length), jnp.int32)
  z3 = jnp.zeros((rows, length, s), jnp.int32)
  return {"group_tokens": z3, "group_lengths": z2 + 1, "positions": z2, "segment_ids": z2 + 1,
          "target_tokens": z3, "target_lengths": z2}


def init_params(cfg: HamburgerConfig, rng: jax.Array, boxed: bool = False):
  """Random HAMburger parameters (unboxed arrays unless `boxed`, which keeps logical axes)."""
  params = HamburgerModel(cfg).init(rng, dummy_batch(cfg))["params"]
  return params if boxed else nn.meta.unbox(params)


def param_count(tree) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(tree))
