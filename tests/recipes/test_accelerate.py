"""The GPU training recipe (`recipes.accelerate`): its carried bundles split and join back, sharded
exports read back, the step sizing, and a dry run of the whole command on this CPU (data ->
segmentation -> timed steps -> training with checkpoints -> held-out evaluation -> sharded export
that the shipped loader opens and decodes)."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from hamburger_jax.convert.errors import CheckpointError
from hamburger_jax.convert.shards import read_params, shard_files, write_shards
from hamburger_jax.recipes import accelerate, accelerate_pack, accelerate_steps


def _files(tmp_path, sizes):
  rng = np.random.default_rng(0)
  paths = []
  for i, n in enumerate(sizes):
    path = tmp_path / "src" / f"pkg{i}-1.0-py3-none-any.whl"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
    paths.append(str(path))
  return paths


def test_bundles_split_under_the_limit_and_join_back(tmp_path):
  files = _files(tmp_path, [300, 2500, 40])
  bundles = accelerate_pack.split_bundles(files, str(tmp_path / "carry"), bundle_bytes=1200)
  assert len(bundles) == 4          # 910 bytes of data each beside SHA256SUMS
  stage = tmp_path / "stage"
  stage.mkdir()
  for b in bundles:
    assert sum(os.path.getsize(os.path.join(b, n)) for n in os.listdir(b)) <= 1200
    for n in os.listdir(b):
      shutil.copy(os.path.join(b, n), stage)
  joined = accelerate_pack.join_parts(str(stage))
  assert sorted(os.path.basename(p) for p in joined) == sorted(os.path.basename(p) for p in files)
  for src in files:
    assert (stage / os.path.basename(src)).read_bytes() == open(src, "rb").read()
  assert not [n for n in os.listdir(stage) if ".part" in n]


def test_join_names_a_missing_bundle(tmp_path):
  files = _files(tmp_path, [3000])
  bundles = accelerate_pack.split_bundles(files, str(tmp_path / "carry"), bundle_bytes=1200)
  stage = tmp_path / "stage"
  stage.mkdir()
  for b in bundles[:-1]:
    for n in os.listdir(b):
      shutil.copy(os.path.join(b, n), stage)
  with pytest.raises(ValueError, match="parts \\[3\\] of 3"):
    accelerate_pack.join_parts(str(stage))


def test_shards_stay_under_the_limit_and_read_back(tmp_path):
  rng = np.random.default_rng(0)
  flat = {f"layer_{i}/kernel": rng.normal(size=(64, 64)).astype(np.float32) for i in range(6)}
  paths = write_shards(str(tmp_path), flat, max_bytes=40_000)
  assert len(paths) == 3 and paths == shard_files(str(tmp_path))
  assert all(os.path.getsize(p) <= 40_000 for p in paths)
  back = read_params(str(tmp_path))
  assert sorted(back) == sorted(flat)
  assert all(np.array_equal(back[k], flat[k]) for k in flat)
  os.remove(paths[1])
  with pytest.raises(CheckpointError, match="incomplete set of shards"):
    read_params(str(tmp_path))


def test_one_tensor_over_the_limit_is_refused(tmp_path):
  with pytest.raises(ValueError, match="shard limit"):
    write_shards(str(tmp_path), {"big": np.zeros(20_000, np.float32)}, max_bytes=40_000)


def test_step_sizing():
  stats = {"examples": 100, "prompt_tokens": 4000, "groups": 6000,
           "split_examples": {"train": 80, "validation": 20}}
  assert accelerate_steps.steps_per_epoch(stats, seq_len=100, batch_size=8) == 10   # 8000/100/8
  assert accelerate_steps.fit_steps(100.0, 0.5, cap=1000) == 200
  assert accelerate_steps.fit_steps(100.0, 0.5, cap=50) == 50
  assert accelerate_steps.fit_steps(-5.0, 0.5, cap=50) == 1


@pytest.mark.heavy       # minutes: the real base through every stage
@pytest.mark.slow
def test_dry_run_trains_evaluates_and_exports_loadable_shards(tmp_path):
  from hamburger_jax.decode.sampler import Sampler
  from hamburger_jax.shipped import smollm2
  out, work = str(tmp_path / "out"), str(tmp_path / "work")
  record = accelerate.main(["--dry_run", "--workdir", work, "--out", out])
  train = record["training"]
  assert train["train_steps"] == train["planned_steps"] == 2 and not train["stopped_early"]
  assert train["data"]["split_examples"] == {"train": 6, "validation": 2}
  for when in ("before", "after"):
    assert np.isfinite(train["held_out"][when]["loss"])
    assert train["held_out"][when]["tokens_per_group"] >= 1
  assert os.listdir(os.path.join(work, "train", "checkpoints"))
  shards = shard_files(out)
  assert shards and all(os.path.getsize(p) <= accelerate_steps.SHARD_BYTES for p in shards)
  with open(os.path.join(out, "manifest.json")) as f:
    assert json.load(f)["base_sha256"] == accelerate_steps.read_manifest()["base_sha256"]
  cfg, params, tok, _ = smollm2.load_shipped(out)
  result = Sampler(cfg, params, cache_length=64).decode(
      [tok.encode("What is 2 plus 2?", chat=True, system=smollm2.SYSTEM_PROMPT)],
      max_new_tokens=4)
  assert len(result.tokens[0]) >= 1


@pytest.mark.heavy       # minutes: the real base through every stage
@pytest.mark.slow
def test_drafter_stage_dry_run_distils_trains_and_exports_a_loadable_drafter(tmp_path):
  # --drafter_minutes == --minutes: the drafter stage alone (the merged stage is tested above).
  from hamburger_jax.decode.checkpoint import (VERIFY_DRAFTER_FILE, load_verify_drafter,
                                               verify_drafter_steps)
  from hamburger_jax.recipes import accelerate_drafter, broad_prompts, verify_drafter
  from hamburger_jax.shipped import smollm2
  out = tmp_path / "out"
  record = accelerate.main(["--dry_run", "--workdir", str(tmp_path / "work"), "--out", str(out),
                            "--drafter_minutes", "30"])
  report = record["verify_drafter"]
  assert sorted(os.listdir(out)) == sorted(accelerate_drafter.FILES)
  new = broad_prompts.answered_prompts(str(out / "sft_more.jsonl.gz"))
  assert len(new) == 3 and not new & broad_prompts.answered_prompts(verify_drafter.DATA)
  depth = verify_drafter_steps(smollm2.ASSET_DIR) or 4     # trained at the shipped drafter's S
  assert report["how"]["steps"] == 2 and report["how"]["verify_steps"] == depth
  assert verify_drafter_steps(str(out)) == depth
  for when in ("heldout_before", "heldout_after"):
    assert report[when]["positions"] > 0 and report[when]["tokens_per_forward"] >= 1
    assert 1 <= report[when]["decoded_tokens_per_forward"] <= depth     # S tokens at most
    assert len(report[when]["conditional_acceptance"]) == depth - 1
  shutil.copy(out / "verify_drafter.safetensors", tmp_path / VERIFY_DRAFTER_FILE)
  _, shipped, _, _ = smollm2.load_shipped()
  params = load_verify_drafter(str(tmp_path), shipped)
  before = load_verify_drafter(smollm2.ASSET_DIR, shipped)
  assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
      jax.tree.leaves(params["micro_decoder"]), jax.tree.leaves(before["micro_decoder"])))


@pytest.mark.parametrize("flags, words", [
    (["--drafter_minutes", "9"], "--drafter_minutes"),
    (["--drafter_lines", "0:9800"], "overlap --heldout_lines"),
    (["--calibrate_lines", "a:b"], "0:3000"),
    (["--drafter_batch", "0"], "--drafter_batch"),
])
def test_drafter_stage_bad_flags_exit_2_before_any_work(flags, words, tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    accelerate.main(["--out", str(tmp_path / "out"), "--minutes", "8", *flags])
  assert e.value.code == 2 and words in capsys.readouterr().err
  assert not (tmp_path / "out").exists()


def _requirements():
  path = os.path.join(os.path.dirname(__file__), "..", "..", "requirements.txt")
  with open(path) as f:
    lines = [line.split("#")[0].strip() for line in f]
  return dict(line.split("==") for line in lines if line)


def test_every_requirement_is_staged_at_its_pin_or_named_as_not_staged():
  # A requirement added without deciding how it reaches the GPU machine fails here (tzdata once
  # stopped a run's distillation there). Staged wheels that requirements.txt does not name are
  # their dependencies.
  norm = lambda name: name.lower().replace("_", "-")
  want = {norm(k): v for k, v in _requirements().items()}
  staged = {norm(n): pin for n, pin in (w.split("==") for w in accelerate_pack.WHEELS)}
  assert {n: (pin, want[n]) for n, pin in staged.items() if n in want and pin != want[n]} == {}
  not_staged = {norm(n) for n in accelerate_pack.NOT_STAGED}
  assert sorted(n for n in want if n not in staged and n not in not_staged) == []
