"""experiments/segmentation_sweep.py: the per-setting statistics on hand-made entropies."""

import numpy as np
import pytest

from experiments import segmentation_sweep


def test_sweep_rows():
  # One response: a hard token, three easy ones, a hard one, two easy ones.
  values = [np.array([3.0, 0.01, 0.02, 0.01, 2.0, 0.5, 0.6])]
  rows = {r["setting"]: r for r in segmentation_sweep.sweep(values, vocab_size=49152)}
  orig = rows["decreasing_v2 min=0.05 ratio=0.3"]
  # decreasing_v2: [3, .01, .02, .01] | [2, .5] (.5 < .3 * 2) | [.6] (.6 >= .3 * 2) -> 4, 2, 1.
  assert orig["tokens_per_group"] == pytest.approx(7 / 3)
  assert orig["size_share"] == pytest.approx([1 / 3, 1 / 3, 0, 1 / 3])
  assert orig["joined_mean_entropy"] == pytest.approx(np.mean([0.01, 0.02, 0.01, 0.5]))
  # min_value 1.0 also merges the 0.6: [3, .01, .02, .01] | [2, .5, .6].
  assert rows["decreasing_v2 min=1 ratio=0.3"]["tokens_per_group"] == pytest.approx(3.5)
  # small_group at H(0.95) (~0.76 nats): 3.0 and 2.0 alone, the rest in runs of <= 4.
  small = rows["small_group p=0.95"]
  assert small["tokens_per_group"] == pytest.approx(7 / 4)
  assert small["threshold"] == pytest.approx(0.7386, abs=1e-3)


@pytest.mark.slow
def test_sweep_command_on_a_prepared_dataset(tmp_path, tokenizer_files, helpers, capsys):
  from hamburger_jax.data import prepare  # pylint: disable=g-import-not-at-top
  prepare.main(["--inputs", helpers.SAMPLE_JSONL, "--tokenizer", tokenizer_files["chatml"],
                "--model", "random:tiny", "--data_dir", str(tmp_path), "--name", "sweep",
                "--max_length", "64", "--no_progress"])
  out = segmentation_sweep.main(["--data_dir", str(tmp_path), "--name", "sweep", "--model",
                                 "random:tiny", "--num_examples", "5",
                                 "--out", str(tmp_path / "sweep.json")])
  assert out["examples"] == 5 and len(out["rows"]) == len(segmentation_sweep.SWEEP)
  for row in out["rows"]:
    assert 1.0 <= row["tokens_per_group"] <= 4.0 and sum(row["size_share"]) == pytest.approx(1.0)
  assert "| sliding p=0.7 |" in capsys.readouterr().out and (tmp_path / "sweep.json").exists()


def test_sweep_bad_input(tmp_path):
  with pytest.raises(SystemExit):
    segmentation_sweep.main(["--data_dir", str(tmp_path), "--name", "x", "--model", "random:tiny",
                             "--num_examples", "0"])
  with pytest.raises(FileNotFoundError, match="hamburger_jax.data.prepare"):
    segmentation_sweep.main(["--data_dir", str(tmp_path), "--name", "missing", "--model",
                             "random:tiny"])
