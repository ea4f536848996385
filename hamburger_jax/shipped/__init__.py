"""Checkpoints known by name (`--ckpt smollm2`): what each needs to load and decode.

    entry = NAMED["smollm2"]      # or named("smollm2"); None for a path
    cfg, params = entry.load()
    entry.asset_dir, entry.system, entry.tokenizer_dir(), entry.decode_defaults()
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from hamburger_jax.shipped import smollm2


@dataclasses.dataclass(frozen=True)
class NamedCheckpoint:
  """A checkpoint known by name."""
  name: str
  asset_dir: str                           # its files (manifest.json, draft_vocab.json, weights)
  system: str                              # default system prompt (it decodes as a chat model)
  tokenizer_dir: Callable[[], str]         # -> a directory holding its tokenizer.json
  decode_defaults: Callable[[], dict]      # -> recommended {"confidence", "min_token_prob"} or {}
  load: Callable[[], tuple[Any, Any]]      # -> (HamburgerConfig, params)


NAMED: dict[str, NamedCheckpoint] = {
    "smollm2": NamedCheckpoint(
        name="smollm2", asset_dir=smollm2.ASSET_DIR, system=smollm2.SYSTEM_PROMPT,
        tokenizer_dir=smollm2.cached_tokenizer_dir,
        decode_defaults=lambda: smollm2.decode_defaults(smollm2.ASSET_DIR),
        load=lambda: smollm2.load_grafted(smollm2.ASSET_DIR)[:2]),
}


def named(ckpt: str) -> NamedCheckpoint | None:
  """The named checkpoint `ckpt` names, or None (a path)."""
  return NAMED.get(ckpt)
