"""`python -m benchmarks.decode_speed --engine floor` (benchmarks/speed/step_floor.py): the floor
arithmetic, and a dry run of a variant with its own XLA flags on the CPU."""

import json
import types

import pytest

from benchmarks import decode_speed
from benchmarks.speed import step_floor


def test_floor_arithmetic_by_hand():
  base = types.SimpleNamespace(num_layers=2, num_kv_heads=3, head_dim=4)
  # rows x layers x 2 x kv_heads x head_dim x slots x itemsize = 5 x 2 x 2 x 3 x 4 x 10 x 2
  assert step_floor.kv_bytes(base, rows=5, slots=10, itemsize=2) == 4800
  assert step_floor.floor_ms(3.35e9, 3.35) == pytest.approx(1.0)     # 3.35 GB at 3.35 TB/s
  assert step_floor.floor_ms(2.4e9 + 2.4e9, 4.8) == pytest.approx(1.0)
  assert step_floor.bandwidth_for("NVIDIA H200", None) == (4.8, "default for H200")
  assert step_floor.bandwidth_for("NVIDIA H100 80GB HBM3", None)[0] == 3.35
  assert step_floor.bandwidth_for("cpu", 0.02) == (0.02, "--bandwidth_tbs")
  with pytest.raises(ValueError, match="--bandwidth_tbs"):
    step_floor.bandwidth_for("cpu", None)


@pytest.mark.slow
def test_dry_run_writes_a_record_per_setting(tmp_path):
  out = tmp_path / "floor.json"
  argv = ["--engine", "floor", "--preset", "tiny", "--num_layers", "2", "--batch_sizes", "1",
          "--prompt_len", "8", "--max_new_tokens", "16", "--repeats", "1",
          "--bandwidth_tbs", "0.02", "--variants", "no_command_buffers", "--out", str(out)]
  result = decode_speed.main(argv)
  assert result == json.loads(out.read_text())
  assert result["complete"] and not result["skipped"]
  assert result["provenance"]["command"].startswith("python -m benchmarks.decode_speed --engine "
                                                    "floor")
  assert "command_buffer" in result["variants"]["no_command_buffers"]["xla_flags"]
  records = result["records"]
  assert [(r["variant"], r["mode"]) for r in records] == [
      ("no_command_buffers", m) for m in ("base", "hamburger")]
  for r in records:
    assert r["ms_per_iteration"] > 0 and r["floor_ms"] > 0 and r["iterations"] > 0
    assert r["ratio"] == pytest.approx(r["ms_per_iteration"] / r["floor_ms"], rel=1e-6)
    assert r["floor_ms"] == pytest.approx(step_floor.floor_ms(r["floor_bytes"], 0.02))
    assert r["floor_bytes"] == r["weight_bytes"] + r["kv_bytes"]
