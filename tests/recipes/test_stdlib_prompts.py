"""Offline prompts from the standard library: deterministic, split by function, non-empty."""

from hamburger_jax.recipes.stdlib_prompts import prompts_for, split_of, stdlib_prompts


def test_prompts_are_deterministic_and_split_by_function():
  a = stdlib_prompts(("textwrap", "heapq", "json"))
  b = stdlib_prompts(("textwrap", "heapq", "json"))
  assert a == b and len(a) > 10
  kinds = {p["kind"] for p in a}
  assert kinds == {"write", "describe", "explain"}
  for p in a:
    assert p["split"] == split_of(p["function"])
  # No function contributes to both splits.
  by_fn = {}
  for p in a:
    by_fn.setdefault(p["function"], set()).add(p["split"])
  assert all(len(s) == 1 for s in by_fn.values())


def test_write_prompt_carries_signature_and_docstring():
  import textwrap
  out = prompts_for("textwrap.dedent", textwrap.dedent)
  write = [p for p in out if p["kind"] == "write"][0]
  assert write["prompt"].startswith("Write a Python function `dedent(text)`")
  assert "Remove any common leading whitespace" in write["prompt"]
