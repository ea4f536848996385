"""Benchmark helpers: the ablation summary from metrics.jsonl records, the markdown table."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))

import report  # noqa: E402  pylint: disable=g-import-not-at-top,import-error
import smollm2_ablation  # noqa: E402  pylint: disable=g-import-not-at-top,import-error


def _eval(step, loss):
  keys = {f"eval/{k}": 0.5 for k in smollm2_ablation.EVAL_KEYS}
  return {"step": step, "time": 0.0, **keys, "eval/loss": loss}


def test_ablation_summary_reads_the_last_eval_and_step_time():
  records = [{"step": s, "time": 100.0 + 12.0 * s, "train/tokens_per_sec": 80.0}
             for s in (5, 10, 15, 20)]
  records += [_eval(10, 3.0), _eval(20, 2.0)]
  out = smollm2_ablation.summarize(records, steps=20)
  assert out["loss"] == 2.0 and out["stop_accuracy"] == 0.5
  assert out["seconds_per_step"] == pytest.approx(12.0)     # first logged interval skipped
  assert smollm2_ablation.summarize(records, steps=30) is None   # unfinished run: retrain


def test_markdown_table():
  assert report.markdown_table(["a", "b"], [[1, "x"], [2.5, "y"]]).splitlines() == [
      "| a | b |", "|---|---|", "| 1 | x |", "| 2.5 | y |"]


def test_ablation_rejects_bad_counts(capsys):
  with pytest.raises(SystemExit):
    smollm2_ablation.main(["--steps", "0"])
  assert "--steps and --batch_size must be >= 1" in capsys.readouterr().err


def test_measure_rejects_a_bad_batch_size():
  from hamburger_jax.decode import evaluation  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="batch_size must be >= 1"):
    evaluation.measure(None, None, None, [[1, 2]], [0.5], max_new_tokens=4, batch_size=0)


def test_quality_rejects_a_negative_batch_size(capsys):
  import quality  # noqa: E402  pylint: disable=g-import-not-at-top,import-error
  with pytest.raises(SystemExit):
    quality.main(["--batch_size", "-1"])
  assert "--batch_size must be >= 0" in capsys.readouterr().err
