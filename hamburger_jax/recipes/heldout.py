"""The held-out prompt set: prompts never distilled or trained on, for measuring the shipped model.

Standard-library functions held out by function (stdlib_prompts.py) and broad recipe prompts held
out by item (broad_prompts.py). Used by the quality and decode-speed benchmarks and experiments.
"""

from __future__ import annotations

from hamburger_jax.recipes.broad_prompts import broad_prompts
from hamburger_jax.recipes.stdlib_prompts import stdlib_prompts

PROMPT_SETS = ("stdlib", "broad", "both", "code")


def _by_kind(prompt_set: str) -> dict[str, list[dict]]:
  """prompt_set -> {"stdlib:<kind>" / "broad:<kind>": [{"prompt", "kind", "code"}, ...]}."""
  by_kind = {}
  if prompt_set in ("stdlib", "both", "code"):
    for p in stdlib_prompts():
      if p["split"] == "heldout" and (prompt_set != "code" or p["kind"] == "write"):
        by_kind.setdefault("stdlib:" + p["kind"], []).append(
            {"prompt": p["prompt"], "kind": p["kind"], "code": p["kind"] == "write"})
  if prompt_set in ("broad", "both"):
    for p in broad_prompts():
      if p["split"] == "heldout":
        by_kind.setdefault("broad:" + p["kind"], []).append(
            {"prompt": p["prompt"], "kind": p["kind"], "code": False})
  return by_kind


def heldout_prompts(n: int, prompt_set: str = "both") -> list[dict]:
  """n held-out prompts (never distilled or trained on), kinds interleaved so a small n has all.

  prompt_set: "stdlib" (standard-library functions held out by function), "broad" (the broad
  recipe prompts held out by item), "both", or "code" (the held-out standard-library prompts
  that ask for a named function). Each -> {"prompt", "kind", "code"}.
  """
  by_kind = _by_kind(prompt_set)
  if not by_kind:
    raise ValueError(f"--prompt_set must be stdlib, broad, both or code, got {prompt_set!r}.")
  out = []
  while len(out) < n and any(by_kind.values()):
    for kind in sorted(by_kind):
      if by_kind[kind] and len(out) < n:
        out.append(by_kind[kind].pop(0))
  return out
