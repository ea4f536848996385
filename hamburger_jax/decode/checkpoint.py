"""One loader for anything decodable: a checkpoint with its tokenizer, knobs and vocabularies.

    d = open_checkpoint("smollm2")                     # or an export dir, an HF Llama dir, ...
    d = open_checkpoint("/tmp/tiny_ckpt", token_ids=True)
    knobs = resolve_knobs({"confidence": None}, d.knob_defaults)
    Sampler(d.config, d.params, base=d.base_only, eos_ids=d.eos_ids, draft_vocab=d.draft_vocab)

`ckpt` is this project's export dir, an HF Llama dir (plain decoding), an original HAMburger
checkpoint file (.ckpt / .safetensors, with `base_config`), or a named checkpoint
(`hamburger_jax.shipped.NAMED`, e.g. "smollm2"). Unusable input raises one clear error:
CheckpointError (missing or unreadable checkpoint, EOS ids outside its vocabulary),
TokenizerError (unreadable tokenizer) or UsageError (no tokenizer, a bad draft vocabulary, too
many code-fence tokens).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

import numpy as np

from hamburger_jax.convert import CheckpointError, load_model
from hamburger_jax.decode import draft_vocab as draft_vocab_lib
from hamburger_jax.decode import draft_width
from hamburger_jax.decode import state as ds
from hamburger_jax.decode.models import MAX_VERIFY_STEPS
from hamburger_jax.decode.prompts import UsageError
from hamburger_jax.model import cpu_dots
from hamburger_jax.model import quantize as quantize_lib
from hamburger_jax.model.config import HamburgerConfig, LlamaConfig
from hamburger_jax.model.kv_cache import KV_DTYPES
from hamburger_jax.shipped import NAMED, named
from hamburger_jax.text.tokenizer import Tokenizer

DEFAULT_KNOBS = {"confidence": 0.8, "min_token_prob": 0.0}   # when the checkpoint recommends none
VERIFY_DRAFTER_FILE = "verify_drafter.safetensors"   # the micro decoder for verified decoding
VERIFY_CALIBRATION_FILE = "verify_calibration.json"   # its drafts' acceptance calibration


@dataclasses.dataclass(frozen=True)
class Decodable:
  """Everything needed to decode a checkpoint."""
  config: HamburgerConfig | LlamaConfig
  params: Any
  base_only: bool                 # a plain Llama checkpoint, or base=True was asked
  tokenizer: Tokenizer | None     # None with token_ids=True
  knob_defaults: dict             # {"confidence": float, "min_token_prob": float} recommended
  chat: bool                      # prompts are wrapped in the chat template
  system: str | None              # the system prompt of chat prompts
  fence_ids: tuple[int, ...]      # code-fence token ids (empty when off / base / no tokenizer)
  draft_vocab: np.ndarray | None  # token ids drafts choose from; None = all
  eos_ids: tuple[int, ...]        # model EOS ids (+ tokenizer stop ids when chat)
  verify_steps: int | None = None  # verified decoding's depth its drafter was made for; None: S
  # Verified decoding's width rule from the drafter's acceptance calibration (`draft_width`), or
  # None (no calibration, or not verified).
  draft_width_rule: Any = None

  @property
  def llama(self) -> LlamaConfig:
    """The base model's config."""
    return self.config.base if isinstance(self.config, HamburgerConfig) else self.config


def resolve_knobs(given: dict, recommended: dict) -> dict:
  """{confidence, min_token_prob}: the given values, else the checkpoint's recommended ones, else
  DEFAULT_KNOBS (None = not given)."""
  return {name: given[name] if given.get(name) is not None else recommended.get(name, value)
          for name, value in DEFAULT_KNOBS.items()}


def check_kv_cache(kv_cache: str) -> None:
  """UsageError unless `kv_cache` names what KV buffers can store (`model/kv_cache.py`)."""
  if kv_cache not in KV_DTYPES:
    raise UsageError(f"--kv_cache {kv_cache!r} is unknown: use one of {', '.join(KV_DTYPES)}.")


def check_cpu_dots(mode: str) -> None:
  """UsageError unless `mode` names a CPU code path for dots (`model/cpu_dots.py`)."""
  if mode not in cpu_dots.MODES:
    raise UsageError(f"--cpu_dots {mode!r} is unknown: use one of {', '.join(cpu_dots.MODES)}.")


def check_quantize(mode: str | None) -> None:
  """UsageError unless `mode` is a weight quantization decoding knows (None, "none", "int8",
  "int8:G")."""
  try:
    quantize_lib.parse_mode(mode)
  except quantize_lib.QuantizeError as e:
    raise UsageError(f"--{e}") from None


def check_verify_steps(steps: int, verify: bool) -> None:
  """UsageError unless --verify_steps is 0 (the drafter's own) or in 2..MAX_VERIFY_STEPS with
  verified decoding on."""
  if steps and not 2 <= steps <= MAX_VERIFY_STEPS or steps < 0:
    raise UsageError(f"--verify_steps must be in 2..{MAX_VERIFY_STEPS} (0: the drafter's own), "
                     f"got {steps}.")
  if steps and not verify:
    raise UsageError("--verify_steps sets the depth of verified decoding: add --verify or drop "
                     "--verify_steps.")


def check_lookup_drafts(min_match: int, verify: bool, branches: int) -> None:
  """UsageError unless --lookup_drafts is in 0..MAX_MATCH, and, when set away from its default,
  verified decoding of one chain is on."""
  from hamburger_jax.decode.lookup_drafts import DEFAULT_MIN_MATCH, MAX_MATCH
  if not 0 <= min_match <= MAX_MATCH:
    raise UsageError(f"--lookup_drafts must be in 0..{MAX_MATCH} (0: off), got {min_match}.")
  if min_match != DEFAULT_MIN_MATCH and min_match and not verify:
    raise UsageError("--lookup_drafts drafts for verified decoding: add --verify or drop "
                     "--lookup_drafts.")
  if min_match != DEFAULT_MIN_MATCH and min_match and branches > 1:
    raise UsageError("--lookup_drafts drafts one chain: drop --draft_branches or set "
                     "--lookup_drafts 0.")


def lookup_setting(min_match: int, verify: bool, branches: int) -> int:
  """The engine's lookup_drafts for these flags (off without verified decoding of one chain)."""
  return min_match if verify and branches == 1 else 0


def width_rule(wanted: bool, calibration, branches: int):
  """The `draft_width_rule` of verified decoding: the checkpoint's calibration (Decodable's) when
  wanted and one chain is drafted (a draft tree sends every chain), else None."""
  return calibration if wanted and branches == 1 else None


def check_draft_branches(branches: int, verify: bool) -> None:
  """UsageError unless --draft_branches is 1, or in 2..MAX_BRANCHES with verified decoding on."""
  from hamburger_jax.decode.draft_tree import MAX_BRANCHES
  if not 1 <= branches <= MAX_BRANCHES:
    raise UsageError(f"--draft_branches must be in 1..{MAX_BRANCHES} (1: one chain of drafts), "
                     f"got {branches}.")
  if branches > 1 and not verify:
    raise UsageError("--draft_branches drafts a tree for verified decoding: add --verify or drop "
                     "--draft_branches.")


def apply_quantize(params, cfg, mode: str | None):
  """`quantize_lib.apply_mode`, its QuantizeError (e.g. a group size G that does not divide a
  weight's input width) as a UsageError."""
  try:
    return quantize_lib.apply_mode(params, cfg, mode)
  except quantize_lib.QuantizeError as e:
    raise UsageError(f"--{e}") from None


def check_checkpoint(ckpt: str) -> None:
  """CheckpointError unless `ckpt` names a checkpoint or an existing path (nothing is read)."""
  if named(ckpt) is None and not os.path.exists(ckpt):
    names = ", ".join(f"'{n}'" for n in NAMED)
    raise CheckpointError(f"No such checkpoint: {ckpt} (pass an export dir, an HF Llama dir, "
                          f"an original HAMburger checkpoint, or {names}).")


def open_checkpoint(ckpt: str, *, base_config: str | None = None, tokenizer: str | None = None,
                    base: bool = False, token_ids: bool = False, draft_vocab: str | None = None,
                    code_fences: bool = True, chat: bool | None = None,
                    system: str | None = None, quantize: str | None = None,
                    verify: bool = False) -> Decodable:
  """Loads `ckpt` and what decoding it needs.

  base_config: HF config.json of the base (original checkpoints). tokenizer: tokenizer.json or
  its directory (default: the named checkpoint's, else beside `ckpt`). base: decode with the base
  model alone. token_ids: no tokenizer. draft_vocab: "full", a draft vocabulary file, or None (the
  checkpoint's own draft_vocab.json if it has one). code_fences: fenced code decodes one token
  per macro step. chat / system: None = the checkpoint's (a named one is a chat model with its
  system prompt; a path is plain text). quantize: "int8" = int8 weights (per-channel scales),
  "int8:G" = scales per group of G inputs, quantized once here (`model/quantize.py`); None or
  "none" = as stored. verify: decoding will be verified (spec
  §9): the micro decoder trained for it (VERIFY_DRAFTER_FILE in the checkpoint dir) replaces the
  merged-mode one when the checkpoint has it.
  """
  check_quantize(quantize)
  check_checkpoint(ckpt)
  entry = named(ckpt)
  if entry is not None:
    chat = True if chat is None else chat
    system = system or entry.system
    if tokenizer is None and not token_ids:
      tokenizer = entry.tokenizer_dir()
  tok = None if token_ids else load_tokenizer(ckpt, tokenizer)
  cfg, params, base_only = _load(ckpt, base_config, base)
  ckpt_dir = checkpoint_dir(ckpt)
  if verify and not base_only:
    params = load_verify_drafter(ckpt_dir, params)
  params = apply_quantize(params, cfg, quantize)
  llama = cfg.base if isinstance(cfg, HamburgerConfig) else cfg
  check_eos_ids(llama, ckpt)
  eos = sorted(set(list(llama.eos_token_ids) + (tok.stop_ids(bool(chat)) if tok else [])))
  recommended = entry.decode_defaults() if entry is not None else {}
  return Decodable(
      config=cfg, params=params, base_only=base_only, tokenizer=tok,
      knob_defaults=resolve_knobs({}, recommended), chat=bool(chat), system=system,
      fence_ids=code_fence_ids(tok, code_fences, base_only),
      draft_vocab=None if base_only else load_draft_vocab(
          draft_vocab, ckpt_dir, cfg),
      eos_ids=tuple(eos),
      verify_steps=verify_drafter_steps(ckpt_dir) if verify and not base_only else None,
      draft_width_rule=verify_calibration(ckpt_dir) if verify and not base_only else None)


def checkpoint_dir(ckpt: str) -> str:
  """The directory holding `ckpt`'s files: a named checkpoint's asset dir, else `ckpt` itself."""
  entry = named(ckpt)
  return entry.asset_dir if entry is not None else ckpt


def verify_drafter_steps(ckpt_dir: str) -> int | None:
  """The tokens per verified forward (drafts + 1) that ckpt_dir's verification drafter was trained
  for (its "verify_steps" metadata), or None (none recorded: the model's max_steps)."""
  path = os.path.join(ckpt_dir, VERIFY_DRAFTER_FILE) if os.path.isdir(ckpt_dir) else ""
  if not os.path.isfile(path):
    return None
  from hamburger_jax.convert.safetensors_io import read_metadata
  steps = read_metadata(path).get("verify_steps")
  if steps is not None and not steps.isdigit():
    raise CheckpointError(f"{path} records verify_steps {steps!r}, not a whole number: rewrite it "
                          "with hamburger_jax.recipes.verify_drafter or delete it.")
  return None if steps is None else int(steps)


def verify_calibration(ckpt_dir: str):
  """The acceptance calibration of ckpt_dir's verification drafter (VERIFY_CALIBRATION_FILE,
  written by `hamburger_jax.recipes.acceptance_calibration` for that very drafter file) as a
  `draft_width.Calibration`, or None (no drafter or no calibration)."""
  drafter = os.path.join(ckpt_dir, VERIFY_DRAFTER_FILE) if os.path.isdir(ckpt_dir) else ""
  path = os.path.join(ckpt_dir, VERIFY_CALIBRATION_FILE) if drafter else ""
  if not os.path.isfile(drafter) or not os.path.isfile(path):
    return None

  fix = ("refit it with `python -m hamburger_jax.recipes.acceptance_calibration --ckpt_dir "
         f"{ckpt_dir}` or delete it.")
  try:
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
    calib = draft_width.check_calibration(record["slope_intercept"])
    want = str(record["drafter_sha256"])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise CheckpointError(f"{path} is not an acceptance calibration ({e}): {fix}") from None
  with open(drafter, "rb") as f:
    have = hashlib.sha256(f.read()).hexdigest()
  if have != want:
    raise CheckpointError(f"{path} was fit for another {VERIFY_DRAFTER_FILE}: {fix}")
  return calib


def load_verify_drafter(ckpt_dir: str, params):
  """params with params["micro_decoder"] from ckpt_dir/VERIFY_DRAFTER_FILE if there is one (made
  by `hamburger_jax.recipes.verify_drafter`), cast to the stored params' dtypes."""
  path = os.path.join(ckpt_dir, VERIFY_DRAFTER_FILE) if os.path.isdir(ckpt_dir) else ""
  if not os.path.isfile(path):
    return params
  from hamburger_jax.convert.native import flatten, unflatten
  from hamburger_jax.convert.safetensors_io import read_safetensors
  flat, _ = read_safetensors(path)
  want = {f"micro_decoder/{k}": v for k, v in flatten(params["micro_decoder"]).items()}
  if set(flat) != set(want) or any(flat[k].shape != want[k].shape for k in want):
    raise CheckpointError(f"{path} does not fit this checkpoint's micro decoder (other layers or "
                          "shapes): retrain it for this checkpoint or delete it.")
  micro = unflatten({k: np.asarray(flat[k], dtype=want[k].dtype) for k in want})
  return {**params, "micro_decoder": micro["micro_decoder"]}


def _load(ckpt: str, base_config: str | None, base: bool):
  """-> (config, params, base_only) from any supported checkpoint."""
  entry = named(ckpt)
  try:
    if entry is not None:
      cfg, params = entry.load()
      return cfg, params, base
    kind, cfg, params = load_model(ckpt, base_config=base_config)
  except (FileNotFoundError, ValueError) as e:
    if isinstance(e, CheckpointError):
      raise
    raise CheckpointError(str(e)) from e
  return cfg, params, base or kind == "llama"


def check_eos_ids(llama: LlamaConfig, ckpt: str) -> None:
  """CheckpointError unless every config EOS id lies in the vocabulary (else EOS never fires)."""
  bad = [i for i in llama.eos_token_ids if not 0 <= int(i) < llama.vocab_size]
  if bad:
    raise CheckpointError(f"{ckpt}: eos_token_ids holds {bad[0]}, outside the vocabulary of "
                          f"{llama.vocab_size} tokens: fix the ids in its config (each in "
                          f"0..{llama.vocab_size - 1}).")


def load_tokenizer(ckpt: str, tokenizer: str | None) -> Tokenizer:
  """The tokenizer at `tokenizer`, else the one beside `ckpt`; UsageError if there is none."""
  tok_path = tokenizer or (ckpt if os.path.isdir(ckpt) else os.path.dirname(ckpt))
  if not tokenizer and not os.path.isfile(os.path.join(tok_path, "tokenizer.json")):
    raise UsageError("No tokenizer: pass --tokenizer PATH/tokenizer.json, or --token_ids to give "
                     "prompts as comma-separated ids.")
  return Tokenizer(tok_path)


def load_draft_vocab(choice: str | None, ckpt_dir: str, cfg) -> np.ndarray | None:
  """The token ids HAMburger's drafts choose from (`decode/draft_vocab.py`), or None for all.

  choice: "full" = the whole vocabulary; a path = that file; None = `ckpt_dir`'s own
  `draft_vocab.json` (the shipped model's: see its manifest) if it has one, else all.
  """
  if not isinstance(cfg, HamburgerConfig):
    return None
  try:
    return draft_vocab_lib.resolve(choice, ckpt_dir, cfg.base.vocab_size)
  except draft_vocab_lib.DraftVocabError as e:
    raise UsageError(f"--draft_vocab: {e}") from None


def code_fence_ids(tokenizer: Tokenizer | None, enabled: bool, base_only: bool) -> tuple[int, ...]:
  """The fence ids HAMburger decodes with (`DecodeKnobs.fence_ids`): the tokenizer's tokens that
  hold ``` when `enabled` (and not base_only), else none."""
  if not enabled or tokenizer is None or base_only:
    return ()
  ids = tuple(tokenizer.fence_ids())
  if len(ids) > ds.MAX_FENCE:
    raise UsageError(f"The tokenizer has {len(ids)} code-fence tokens, more than the "
                     f"{ds.MAX_FENCE} supported: turn code fences off (decode.py "
                     "--nocode_fences, the server --no-code_fences).")
  return ids
