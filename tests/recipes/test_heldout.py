"""The held-out prompt set (hamburger_jax/recipes/heldout.py): never trained on, kinds
interleaved."""

import pytest

from hamburger_jax.decode import evaluation
from hamburger_jax.recipes.heldout import heldout_prompts
from hamburger_jax.recipes.stdlib_prompts import stdlib_prompts


def test_code_prompt_set_is_the_held_out_named_function_prompts():
  code = heldout_prompts(40, "code")
  assert len(code) == 40 and all(p["code"] and p["kind"] == "write" for p in code)
  assert all(evaluation.required_name(p["prompt"]) for p in code)
  trained = {p["prompt"] for p in stdlib_prompts() if p["split"] == "train"}
  assert not trained & {p["prompt"] for p in code}
  mixed = heldout_prompts(24, "both")
  assert 0 < sum(p["code"] for p in mixed) < 24
  with pytest.raises(ValueError, match="--prompt_set must be stdlib, broad, both or code"):
    heldout_prompts(4, "python")
