"""Quality metrics of the speed-quality benchmark, and a CI-sized run of it on random weights."""

import jax
import numpy as np
import pytest

from hamburger_jax.decode import evaluation
from hamburger_jax.model.config import get_preset
from hamburger_jax.model.hamburger import init_params
from hamburger_jax.decode.sampler import Sampler


def test_code_parses():
  assert evaluation.code_parses("Here:\n```python\ndef f(x):\n    return x + 1\n```\nDone.")
  assert not evaluation.code_parses("```python\ndef f(x:\n    return\n```")
  assert evaluation.code_parses("x = 1")
  assert not evaluation.code_parses("The answer is: def (")


def test_required_names():
  prompt = "Write a Python function `generic_visit(self, node)` that does the following: ..."
  assert evaluation.required_name(prompt) == "generic_visit"
  assert evaluation.required_name("Explain the Python keyword `class` to a beginner.") is None
  assert evaluation.keeps_name("```python\ndef generic_visit(self, node):\n  pass\n```",
                               "generic_visit")
  assert not evaluation.keeps_name("def generic_visitor(self, node): pass", "generic_visit")
  assert not evaluation.keeps_name("def visit(self, node): pass", "generic_visit")


def test_agreement():
  assert evaluation.agreement([1, 2, 3], [1, 2, 3]) == (1.0, True)
  frac, exact = evaluation.agreement([1, 2, 4, 5], [1, 2, 3])
  assert frac == 0.5 and not exact
  assert evaluation.agreement([], []) == (0.0, True)


@pytest.mark.slow
def test_measure_on_tiny_random_model():
  """The benchmark's numbers are consistent with each other (the real figures need trained weights)."""
  cfg = get_preset("tiny")
  params = init_params(cfg, jax.random.PRNGKey(0))
  prompts = [[5, 6, 7, 8], [9, 10, 11]]
  kw = dict(cache_length=32, out_length=12)
  ham, base = Sampler(cfg, params, **kw), Sampler(cfg, params, base=True, **kw)
  scorer = evaluation.BaseScorer(cfg.base, params["base"])
  result = evaluation.measure(ham, base, scorer, prompts, [0.5, 1.0], max_new_tokens=12,
                              decode_text=lambda ids: " ".join(map(str, ids)),
                              code_prompt=[True, False], required_names=["f", None])
  rows = {r["confidence"]: r for r in result["rows"]}
  assert all(r["names_kept"] == 0.0 for r in result["rows"])   # digits never spell "def f("
  assert rows[None]["token_agreement"] == 1.0 and rows[None]["exact_match"] == 1.0
  # Confidence 1.0 never continues a group: every macro step is one token, identical to the base.
  assert rows[1.0]["tokens_per_step"] == 1.0 and rows[1.0]["exact_match"] == 1.0
  np.testing.assert_allclose(rows[1.0]["base_nll"], rows[None]["base_nll"], rtol=1e-6)
  assert 1.0 <= rows[0.5]["tokens_per_step"] <= cfg.max_steps
  np.testing.assert_allclose(rows[0.5]["kv_per_token"] * rows[0.5]["tokens_per_step"], 1.0)
  assert "| hamburger | 0.500 |" in evaluation.format_table(result)


@pytest.mark.slow
def test_measure_batch_size_changes_speed_not_quality():
  """One prompt per call or all together: the same tokens and quality figures, per-row macro steps."""
  cfg = get_preset("tiny")
  params = init_params(cfg, jax.random.PRNGKey(1))
  prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
  kw = dict(cache_length=32, out_length=10)
  ham, base = Sampler(cfg, params, **kw), Sampler(cfg, params, base=True, **kw)
  scorer = evaluation.BaseScorer(cfg.base, params["base"])
  runs = {b: evaluation.measure(ham, base, scorer, prompts, [0.5], max_new_tokens=10,
                                batch_size=b, paired=b == 1) for b in (1, None)}
  paired = runs[1]["rows"][1]
  np.testing.assert_allclose(paired["speedup"],
                             paired["tokens_per_s"] / paired["base_tokens_per_s"])
  assert runs[1]["batch_size"] == 1 and runs[None]["batch_size"] == 3
  for key in ("tokens", "tokens_per_step", "kv_per_token", "token_agreement", "base_nll"):
    np.testing.assert_allclose([r[key] for r in runs[1]["rows"]],
                               [r[key] for r in runs[None]["rows"]], rtol=1e-6)
