"""Preparing a dataset end to end: JSONL -> tokens -> segments -> array_record -> read back."""

import json
import os

import jax
import numpy as np
import pytest

from tests.fixture_paths import REPO
import tensorflow_datasets as tfds

from hamburger_jax.data import builder, prepare as prepare_lib
from hamburger_jax.data.prepare import PrepareConfig, prepare_dataset as prepare
from hamburger_jax.model.scoring import Scorer
from hamburger_jax.data.sources import DataError, SourceConfig
from hamburger_jax.data.strategies import SegmentationConfig, group_sizes
from hamburger_jax.data.tokenize import ChatTokenizer, TokenizeConfig

SEG = SegmentationConfig("sliding", max_steps=4, threshold=6.3)   # ~ln 512: a mix of sizes


def _config(tmp_path, tokenizer, inputs, **kw):
  source = kw.pop("source", {})
  return PrepareConfig(SourceConfig(inputs, **source), TokenizeConfig(tokenizer, max_length=64),
                       kw.pop("seg", SEG), str(tmp_path / "data"), kw.pop("name", "sample"),
                       chunk_size=kw.pop("chunk_size", 8), **kw)


def _read(data_dir, name, split="train"):
  src = tfds.data_source(f"hamburger_sft/{name}", split=split, data_dir=data_dir)
  return [(r["tokens"].tolist(), int(r["prompt_length"]), r["steps"].tolist()) for r in src]


def _expected(tokenizer, model, pairs):
  """The examples prepared independently: tokenize, score, group."""
  tok = ChatTokenizer(TokenizeConfig(tokenizer, max_length=64))
  seqs, plens = [], []
  for p, r in pairs:
    prompt, response = tok.encode_prompt(p), tok.encode_response(r)
    response = response[:64 - len(prompt)]           # the default rule: truncate
    seqs.append(np.asarray(prompt + response, np.int32))
    plens.append(len(prompt))
  values = Scorer(*model, max_length=64).score(seqs)
  return [(s.tolist(), t, group_sizes(v[t:], SEG, model[0].vocab_size).tolist())
          for s, t, v in zip(seqs, plens, values)]


def test_prepare_writes_and_reads_back(tmp_path, tokenizer_files, tiny_model, helpers):
  cfg = _config(tmp_path, tokenizer_files["llama3"], helpers.SAMPLE_JSONL)
  result = prepare(cfg, tiny_model, progress=False)
  assert not result.skipped and result.path == builder.dataset_dir(cfg.data_dir, "sample")
  got = _read(cfg.data_dir, "sample")
  expected = _expected(tokenizer_files["llama3"], tiny_model, helpers.sample_pairs())
  assert got == expected
  sizes = [s for _, _, steps in got for s in steps]
  assert set(sizes) - {1} and max(sizes) <= 4           # some groups merged, none above S
  stats = result.stats
  assert stats["examples"] == 24 and stats["groups"] == len(sizes)
  assert stats["response_tokens"] == sum(sizes)
  assert stats["prompt_tokens"] == sum(t for _, t, _ in got)
  assert stats["group_size_histogram"] == {str(k): sizes.count(k) for k in sorted(set(sizes))}
  info = builder.read_info(cfg.data_dir, "sample")
  assert info.metadata["stats"] == stats and info.metadata["template"] == "llama3"
  assert info.metadata["max_steps"] == 4
  assert not os.listdir(os.path.join(cfg.data_dir, ".work"))   # chunks removed once written

  # Idempotent: a second run keeps the files; --overwrite rebuilds them.
  shard = next(f for f in os.listdir(result.path) if "array_record" in f)
  mtime = os.path.getmtime(os.path.join(result.path, shard))
  again = prepare(cfg, tiny_model, progress=False)
  assert again.skipped and again.stats == stats
  assert os.path.getmtime(os.path.join(result.path, shard)) == mtime
  rebuilt = prepare(_config(tmp_path, tokenizer_files["llama3"], helpers.SAMPLE_JSONL,
                            overwrite=True, seg=SegmentationConfig("sliding", threshold=0.0)),
                    tiny_model, progress=False)
  assert not rebuilt.skipped
  assert all(steps == [1] * len(steps) for _, _, steps in _read(cfg.data_dir, "sample"))


def test_eval_split_and_lm_mode(tmp_path, tokenizer_files, helpers):
  src = dict(mode="lm", text_field="response")
  cfg = PrepareConfig(SourceConfig(helpers.SAMPLE_JSONL, **src),
                      TokenizeConfig(tokenizer_files["plain"], mode="lm", max_length=64),
                      SEG, str(tmp_path), "lm", eval_examples=5)
  result = prepare(cfg, model=None, progress=False)
  train, val = _read(str(tmp_path), "lm"), _read(str(tmp_path), "lm", "validation")
  assert (len(train), len(val), result.stats["examples"]) == (19, 5, 24)
  tok = ChatTokenizer(cfg.tokenize)
  texts = sorted(tok.decode(t[1:]) for t, _, _ in train + val)
  assert texts == sorted(r + "</s>" for _, r in helpers.sample_pairs())
  assert all(p == 1 and t[0] == tok.bos_id and s == [1] * (len(t) - 1) for t, p, s in train + val)
  assert result.stats["tokens_per_group"] == 1.0


def test_bad_record_fails_before_any_work(tmp_path, tokenizer_files, tiny_model, helpers):
  lines = open(helpers.SAMPLE_JSONL, encoding="utf-8").read().splitlines()
  lines[19] = json.dumps({"prompt": "no answer here", "answer": "x"})
  lines[3] = json.dumps({"prompt": "empty", "response": ""})
  path = tmp_path / "bad.jsonl"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  cfg = _config(tmp_path, tokenizer_files["llama3"], str(path))
  with pytest.raises(DataError, match=r"bad.jsonl:20: no field 'response'.*response_field"):
    prepare(cfg, tiny_model, progress=False)
  assert not os.path.exists(os.path.join(cfg.data_dir, "hamburger_sft"))
  skip = _config(tmp_path, tokenizer_files["llama3"], str(path), source={"on_error": "skip"})
  result = prepare(skip, tiny_model, progress=False)
  assert result.stats["examples"] == 22
  assert result.counters["skipped_missing_field"] == 1
  assert result.counters["skipped_empty_response"] == 1
  with pytest.raises(DataError, match="No examples left"):
    prepare(_config(tmp_path, tokenizer_files["llama3"], helpers.SAMPLE_JSONL, name="none",
                    source={"response_field": "nope", "on_error": "skip"}), tiny_model,
            progress=False)


def test_crash_mid_way_resumes_and_keeps_old_version(tmp_path, tokenizer_files, tiny_model,
                                                     helpers, monkeypatch):
  cfg = _config(tmp_path, tokenizer_files["llama3"], helpers.SAMPLE_JSONL, name="resume")
  real = prepare_lib.segment_examples
  calls = []

  def flaky(examples, *args, **kw):
    calls.append(len(examples))
    if len(calls) == 2:
      raise RuntimeError("device lost")
    return real(examples, *args, **kw)

  monkeypatch.setattr(prepare_lib, "segment_examples", flaky)
  with pytest.raises(RuntimeError, match="device lost"):
    prepare(cfg, tiny_model, progress=False)
  assert not builder.dataset_exists(cfg.data_dir, "resume")
  prepare(cfg, tiny_model, progress=False)
  assert calls == [8, 8, 8, 8]                     # chunk 0 was kept; 1 and 2 ran again
  expected = _expected(tokenizer_files["llama3"], tiny_model, helpers.sample_pairs())
  assert _read(cfg.data_dir, "resume") == expected
  assert not os.listdir(os.path.join(cfg.data_dir, ".work"))

  # A failing --overwrite leaves the existing version readable.
  calls.clear()
  monkeypatch.setattr(prepare_lib, "segment_examples", lambda *a, **k: 1 / 0)
  with pytest.raises(ZeroDivisionError):
    prepare(_config(tmp_path, tokenizer_files["llama3"], helpers.SAMPLE_JSONL, name="resume",
                    overwrite=True, seg=SegmentationConfig("decreasing")), tiny_model,
            progress=False)
  assert _read(cfg.data_dir, "resume") == expected


def test_cli(tmp_path, tokenizer_files, tiny_model, helpers, monkeypatch, capsys):
  loader = tmp_path / "tiny_loader_for_cli.py"
  loader.write_text("MODEL = None\n\ndef load():\n  return MODEL\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  import tiny_loader_for_cli  # pylint: disable=g-import-not-at-top,import-error
  monkeypatch.setattr(tiny_loader_for_cli, "MODEL", tiny_model)
  argv = ["--inputs", helpers.SAMPLE_JSONL, "--tokenizer", tokenizer_files["chatml"],
          "--model", "tiny_loader_for_cli:load", "--data_dir", str(tmp_path / "d"),
          "--name", "cli", "--max_length", "64", "--strategy", "small_group",
          "--threshold_p", "0.5", "--threshold_vocab_size", "2", "--no_progress"]
  result = prepare_lib.main(argv)
  out = capsys.readouterr().out
  assert "Wrote" in out and "examples/s" in out and "tokens per group" in out
  assert "examples          24" in out and "group sizes:" in out
  assert len(_read(str(tmp_path / "d"), "cli")) == 24 and result.stats["examples"] == 24
  prepare_lib.main(argv)
  assert "exists: kept" in capsys.readouterr().out


def test_self_distillation_hook(tmp_path, tokenizer_files, tiny_model, helpers):
  cfg = _config(tmp_path, tokenizer_files["llama3"], helpers.SAMPLE_JSONL, name="distilled")
  eot = ChatTokenizer(cfg.tokenize).eos_id
  seen = []

  def generate(prompts):
    seen.extend(prompts)
    return [[7, 8, 9, eot] if i % 2 else [] for i in range(len(prompts))]

  result = prepare(cfg, tiny_model, generate=generate, progress=False)
  got = _read(cfg.data_dir, "distilled")
  assert len(seen) == 24 and len(got) == result.stats["examples"] == 12
  assert result.counters["skipped_empty_distilled"] == 12
  for tokens, t, steps in got:
    assert tokens[t:] == [7, 8, 9, eot] and sum(steps) == 4
    assert tokens[:t] in seen


def test_module_entry_point(tmp_path, tokenizer_files, helpers):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = REPO
  base = [sys.executable, "-m", "hamburger_jax.data.prepare", "--mode", "lm",
          "--text_field", "response", "--tokenizer", tokenizer_files["plain"],
          "--data_dir", str(tmp_path), "--name", "cli_lm", "--no_progress"]
  env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
  ok = subprocess.run(base + ["--inputs", helpers.SAMPLE_JSONL], capture_output=True, text=True,
                      env=env, cwd=root, check=False)
  assert ok.returncode == 0, ok.stderr
  assert "tokens per group  1.000" in ok.stdout and "RuntimeWarning" not in ok.stderr
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"text": "no response field"}\n')
  fail = subprocess.run(base + ["--inputs", str(bad), "--name", "bad"], capture_output=True,
                        text=True, env=env, cwd=root, check=False)
  assert fail.returncode == 2 and "bad.jsonl:1: no field 'response'" in fail.stderr
  assert "Traceback" not in fail.stderr


def test_resume_fingerprint_follows_the_model(tmp_path, tokenizer_files, tiny_model, helpers):
  """Chunks left by a crashed run are reused only with the same inputs and the same model."""
  cfg, params = tiny_model
  other = (cfg, jax.tree.map(lambda x: x + 1, params))
  assert prepare_lib._model_fingerprint(tiny_model) == prepare_lib._model_fingerprint(
      (cfg, params))
  assert prepare_lib._model_fingerprint(tiny_model) != prepare_lib._model_fingerprint(other)
  with pytest.raises(DataError, match="eval_examples"):
    prepare(_config(tmp_path, tokenizer_files["llama3"], helpers.SAMPLE_JSONL, eval_examples=24),
            tiny_model, progress=False)


def test_cli_decreasing_v2_thresholds(tmp_path, tokenizer_files, tiny_model, helpers, monkeypatch):
  """--min_value / --ratio reach the strategy: min_value above every entropy merges groups of 4."""
  loader = tmp_path / "tiny_loader_for_cli_v2.py"
  loader.write_text("MODEL = None\n\ndef load():\n  return MODEL\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  import tiny_loader_for_cli_v2  # pylint: disable=g-import-not-at-top,import-error
  monkeypatch.setattr(tiny_loader_for_cli_v2, "MODEL", tiny_model)
  base = ["--inputs", helpers.SAMPLE_JSONL, "--tokenizer", tokenizer_files["chatml"],
          "--model", "tiny_loader_for_cli_v2:load", "--max_length", "64", "--no_progress",
          "--strategy", "decreasing_v2"]
  strict = prepare_lib.main(base + ["--data_dir", str(tmp_path / "a"), "--name", "strict"])
  loose = prepare_lib.main(base + ["--data_dir", str(tmp_path / "b"), "--name", "loose",
                                   "--min_value", "1e9", "--ratio", "0.3"])
  assert strict.stats["tokens_per_group"] == pytest.approx(1.0)   # random model: nothing merges
  for tokens, t, steps in _read(str(tmp_path / "b"), "loose"):
    n = len(tokens) - t
    assert steps == [4] * (n // 4) + ([n % 4] if n % 4 else [])
  assert loose.stats["tokens_per_group"] > 3.0
