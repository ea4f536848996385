"""The model side of the decode loop: one small interface, two implementations.

    model, params = decode_model(cfg, params, base=False)
    features, cache = model.forward(params, groups [B, T, S], lengths [B, T], positions [B, T],
                                    cache, slots [B])             # features [B, T, F, D]
    (forward(.., skip_unmerged=True): no merge work when no input is merged)
    features, entries = model.forward_unmerged(params, tokens [B, T], positions, cache, slots)
    cache = write_entries(cache, entries, slots)  # plain tokens (verified decoding; HAMburger)
    logits, stop = model.heads(params, hidden [B, D])             # [B, V], [B] float32
    logits, stop, rest = model.draft_heads(params, hidden [B, D])  # [B, K] over the draft ids
    stop = model.stop_logits(params, hidden [B, D])               # [B] (HAMburger only)
    micro = model.micro_prefill(params, features [B, F, D])       # fresh micro KV cache
    out, micro = model.micro_step(params, prev_tokens [B], j, micro)   # j >= 1, out [B, D]

`HamburgerDecodeModel` runs the compositional embedder, the base and the micro-step decoder;
`BaseDecodeModel` is the plain Llama (groups of one token, no micro steps: max_steps == 1).
Both are frozen dataclasses holding only the config, so they are hashable compile-key parts.
`decode_model(.., draft_vocab=ids)`: drafts (micro steps >= 1) read only those K rows of the LM
head (`hamburger_jax.decode.draft_vocab`); the ids and their rows travel in params["draft"]
(the rows int8 with a "table_scale" under quantize "micro:int8").
`prompt_scorer(model, params)`: log-probs of a prompt's tokens, as the model reads a prompt.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from hamburger_jax.decode import draft_vocab as draft_vocab_lib
from hamburger_jax.decode.prompts import DecodeInputError
from hamburger_jax.model import kv_cache
from hamburger_jax.model.config import HamburgerConfig, LlamaConfig
from hamburger_jax.model.execution import Execution
from hamburger_jax.model.hamburger import HamburgerModel
from hamburger_jax.model.layers import attend_rows
from hamburger_jax.model.llama import LlamaModel
from hamburger_jax.model.quantize import (DRAFT_TABLE_SCALE, head_rows, is_quantized,
                                          quantize_draft_rows)
from hamburger_jax.model.scoring import Scorer


@dataclasses.dataclass(frozen=True)
class HamburgerDecodeModel:
  """HAMburger decoding: merged groups in, up to cfg.max_steps tokens out per macro step."""
  cfg: HamburgerConfig
  draft_size: int = 0     # K > 0: drafts come from params["draft"] ({"ids" [K], "table" [K, D]})

  @property
  def llama(self) -> LlamaConfig:
    return self.cfg.base

  def base_params(self, params):
    return params["base"]

  @property
  def max_steps(self) -> int:
    return self.cfg.max_steps

  def _apply(self, params, *args, method, execution=Execution(), **kwargs):
    params = {k: v for k, v in params.items() if k != "draft"}
    return HamburgerModel(self.cfg, execution).apply({"params": params}, *args, method=method,
                                                     **kwargs)

  def forward(self, params, group_tokens, group_len, positions, cache, slots,
              skip_unmerged: bool = False):
    out = self._apply(params, group_tokens, group_len, positions, cache=cache, cache_slots=slots,
                      skip_unmerged=skip_unmerged,
                      method=HamburgerModel.base_forward)
    return out.features, out.cache

  def forward_unmerged(self, params, tokens, positions, cache, slots, block_mask=None):
    """tokens [B, T], one slot and position each -> (features [B, T, F, D], the new KV entries
    per layer, [B, T, ..] per buffer); the cache is read, not written (`write_entries`).
    block_mask [T, T] bool: the inputs are a draft tree (query t sees input u iff [t, u])."""
    out = self._apply(params, tokens, positions, cache, slots, block_mask,
                      method=HamburgerModel.unmerged_forward,
                      execution=Execution(cache_write="returned"))
    return out.features, out.cache

  def heads(self, params, hidden):
    return self._apply(params, hidden, decoding=True, method=HamburgerModel.heads)

  def stop_logits(self, params, hidden):
    """hidden [B, D] -> the stop head's logits [B] float32 (no LM head)."""
    return self._apply(params, hidden, method=HamburgerModel.stop)

  def draft_heads(self, params, hidden):
    """hidden [B, D] -> (logits [B, K] over params["draft"]["ids"], stop [B], rest [B, R]).

    rest: the logits of a fixed sample of R other tokens plus log(their weight), so that
    logsumexp over [logits, rest] estimates the whole vocabulary's log-normaliser (exact when
    the sample is all of them). float32.
    """
    draft = params["draft"]
    k = self.draft_size
    table, scale = draft["table"], draft.get(DRAFT_TABLE_SCALE)
    if scale is None:
      both = attend_rows(hidden.astype(table.dtype), table)                   # [B, K + R]
    else:                           # int8 rows ("micro:int8"), the convert left to fuse
      dtype = self.cfg.base.jnp_dtype
      both = attend_rows(hidden.astype(dtype), table.astype(dtype)) * scale
    rest = both[:, k:] + draft["rest_log_weight"]
    return both[:, :k], self._apply(params, hidden, method=HamburgerModel.stop), rest

  def micro_prefill(self, params, features):
    return self._apply(params, features, method=HamburgerModel.micro_prefill)

  def micro_step(self, params, prev_tokens, step, cache):
    return self._apply(params, prev_tokens, step, cache, method=HamburgerModel.micro_step)

  def micro_prefill_step(self, params, features, first_tokens):
    """features [B, F, D], step 0's tokens [B] -> (step 1's out [B, D], micro cache)."""
    return self._apply(params, features, first_tokens, method=HamburgerModel.micro_prefill_step)


@dataclasses.dataclass(frozen=True)
class BaseDecodeModel:
  """Plain base-model decoding: one token per macro step (features = the final hidden state)."""
  cfg: LlamaConfig
  max_steps: int = dataclasses.field(default=1, init=False)
  draft_size: int = dataclasses.field(default=0, init=False)     # no drafts

  @property
  def llama(self) -> LlamaConfig:
    return self.cfg

  def base_params(self, params):
    return params

  def forward(self, params, group_tokens, group_len, positions, cache, slots,
              skip_unmerged: bool = False):
    del group_len, skip_unmerged                            # always 1: nothing merged
    out = LlamaModel(self.cfg).apply({"params": params}, group_tokens[..., 0],
                                     positions=positions, cache=cache, cache_slots=slots,
                                     return_logits=False)
    return out.hidden[:, :, None], out.cache

  def heads(self, params, hidden):
    logits = LlamaModel(self.cfg).apply({"params": params}, hidden, decoding=True,
                                        method=LlamaModel.logits)
    return logits, jnp.zeros(hidden.shape[:1], jnp.float32)

  def micro_prefill(self, params, features):
    raise NotImplementedError("Base decoding has no micro steps (max_steps == 1).")

  def micro_step(self, params, prev_tokens, step, cache):
    raise NotImplementedError("Base decoding has no micro steps (max_steps == 1).")


DecodeModel = HamburgerDecodeModel | BaseDecodeModel


def write_entries(cache, entries, slots):
  """Writes forward_unmerged's new entries (per layer, [B, T, ..] per buffer) into the cache
  at per-row slots [B] (out-of-range slots drop) -> the cache."""
  return [kv_cache.write_entries(layer, new, slots) for layer, new in zip(cache, entries)]


MAX_VERIFY_STEPS = 16


def verify_depth(cfg: HamburgerConfig, params, steps: int) -> tuple[HamburgerConfig, dict]:
  """(cfg, params) whose verified decoding commits up to `steps` tokens a forward (steps - 1
  drafts; the micro decoder's positions run on past cfg.max_steps). Verified decoding feeds the
  embedder single tokens only, which never read its position table: the table is cut or
  zero-padded to `steps` rows so that the shapes agree."""
  if not 2 <= steps <= MAX_VERIFY_STEPS:
    raise ValueError(f"verify_steps must be in 2..{MAX_VERIFY_STEPS} (tokens a verified forward "
                     f"commits at most: drafts + 1), got {steps}.")
  if steps == cfg.max_steps:
    return cfg, params
  pos = params["embedder"]["pos"]
  pos = jnp.pad(jnp.asarray(pos), ((0, max(0, steps - pos.shape[0])), (0, 0)))[:steps]
  return (dataclasses.replace(cfg, max_steps=steps),
          {**params, "embedder": {**params["embedder"], "pos": pos}})


def decode_model(cfg, params, base: bool = False, draft_vocab=None,
                 rest_sample: int = draft_vocab_lib.REST_SAMPLE,
                 verify_steps: int | None = None) -> tuple[DecodeModel, dict]:
  """(cfg, params) of a HAMburger or a Llama model -> (decode model, the params it reads).

  With `base=True` a HAMburger model decodes with its base alone (params["base"]).
  verify_steps: for verified decoding, the tokens a forward commits at most (`verify_depth`;
  None: cfg.max_steps).
  draft_vocab: token ids [K] that drafts (micro steps >= 1) choose from, or None for the whole
  vocabulary; their LM-head rows are gathered once here, with those of `rest_sample` of the
  other tokens (a fixed sample) that estimate the mass a draft's probability leaves out (see
  `draft_heads`); int8 rows when the micro decoder alone is int8 (quantize "micro:int8"). The
  base alone has no drafts.
  """
  if isinstance(cfg, HamburgerConfig):
    if base:
      return BaseDecodeModel(cfg.base), params["base"]
    if verify_steps is not None:
      cfg, params = verify_depth(cfg, params, verify_steps)
    if draft_vocab is None:
      return HamburgerDecodeModel(cfg), params
    ids = draft_vocab_lib.check(draft_vocab, cfg.base.vocab_size)
    rest, weight = draft_vocab_lib.rest_sample(ids, cfg.base.vocab_size, rest_sample)
    rows = jnp.asarray(np.concatenate([ids, rest]))
    table = head_rows(params["base"], rows, cfg.base.tie_word_embeddings, cfg.base.jnp_dtype)
    draft = {"ids": jnp.asarray(ids), "table": table,
             "rest_log_weight": jnp.float32(np.log(weight))}
    if is_quantized(params["micro_decoder"]) and not is_quantized(params["base"]):
      draft = quantize_draft_rows(draft)         # the drafter alone in int8 ("micro:int8")
    return HamburgerDecodeModel(cfg, int(ids.size)), {**params, "draft": draft}
  if isinstance(cfg, LlamaConfig):
    return BaseDecodeModel(cfg), params
  raise TypeError(f"Expected a HamburgerConfig or a LlamaConfig, got {type(cfg).__name__}.")


def engine_model(cfg, params, base: bool, draft_vocab, verify: bool,
                 verify_steps: int | None) -> tuple[DecodeModel, dict]:
  """`decode_model` for a decode engine, its mode checked: DecodeInputError (one line) for verified
  decoding without micro steps, or a verify_steps without verified decoding or out of range."""
  if verify_steps is not None and not (verify and not base):
    raise DecodeInputError("verify_steps sets the depth of verified decoding: pass it with "
                           "verify=True (--verify) on a HAMburger model, or drop it.")
  try:
    model, params = decode_model(cfg, params, base, draft_vocab, verify_steps=verify_steps)
  except ValueError as e:
    raise DecodeInputError(str(e)) from None
  if verify and model.max_steps == 1:
    raise DecodeInputError("Verified decoding needs a HAMburger model with micro steps; the "
                           "base alone has no drafts to verify (drop --base or --verify).")
  return model, params


def prompt_scorer(model: DecodeModel, params, max_length: int) -> Scorer:
  """Per-token log-probs of prompts (`Scorer.top_log_probs`) as `model` reads them: a prompt
  fills one KV slot per token, so HAMburger's are its base model's (and the first generated
  token's distribution, after the whole prompt, is the base's too)."""
  return Scorer(model.llama, model.base_params(params), metric="nll", max_length=max_length)
