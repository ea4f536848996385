"""Every unusable checkpoint fails with a CheckpointError that names the problem."""

import builtins
import json
import os
import shutil

import numpy as np
import pytest

from tests.fixture_paths import OFFICIAL_TINY
from hamburger_jax.model.config import get_preset
from hamburger_jax.convert import (CheckpointError, load_hamburger, load_hf_llama, load_model,
                                   load_original, save_hamburger)
from hamburger_jax.convert.safetensors_io import read_safetensors, write_safetensors

CKPT = os.path.join(OFFICIAL_TINY, "tiny_official.ckpt")
SAFE = os.path.join(OFFICIAL_TINY, "tiny_official.safetensors")
CONFIG = os.path.join(OFFICIAL_TINY, "config.json")


def _rewrite(tmp_path, edit):
  tensors, meta = read_safetensors(SAFE)
  tensors = {k: np.array(v) for k, v in tensors.items()}
  edit(tensors)
  path = tmp_path / "edited.safetensors"
  write_safetensors(path, tensors, meta)
  return str(path)


def test_missing_key(tmp_path):
  path = _rewrite(tmp_path, lambda t: t.pop("micro_step_decoder.stop_head.2.bias"))
  with pytest.raises(CheckpointError, match="lacks the weights.*stop_head.2.bias"):
    load_original(path, CONFIG)


def test_wrong_shape(tmp_path):
  def edit(t):
    t["comp_embedder.out_proj.weight"] = np.zeros((64, 32), np.float32)
  with pytest.raises(CheckpointError, match=r"out_proj.weight has shape \(64, 32\).*expects \(64, 64\)"):
    load_original(_rewrite(tmp_path, edit), CONFIG)


def test_wrong_dtype_class(tmp_path):
  def edit(t):
    t["model.model.norm.weight"] = np.ones((64,), np.int32)
  with pytest.raises(CheckpointError, match="norm.weight has dtype int32; a floating-point"):
    load_original(_rewrite(tmp_path, edit), CONFIG)


def test_bf16_and_extra_entries_are_handled(tmp_path):
  import ml_dtypes
  def edit(t):
    t["model.model.norm.weight"] = t["model.model.norm.weight"].astype(ml_dtypes.bfloat16)
    t["optimizer.state.0.exp_avg"] = np.zeros((3,), np.float32)
  _, params = load_original(_rewrite(tmp_path, edit), CONFIG)
  assert params["base"]["norm"]["scale"].dtype == np.float32


def test_truncated_safetensors(tmp_path):
  data = open(SAFE, "rb").read()
  path = tmp_path / "cut.safetensors"
  path.write_bytes(data[: len(data) // 2])
  with pytest.raises(CheckpointError, match="truncated"):
    load_original(str(path), CONFIG)


def test_truncated_ckpt(tmp_path):
  pytest.importorskip("torch")
  data = open(CKPT, "rb").read()
  path = tmp_path / "cut.ckpt"
  path.write_bytes(data[: len(data) // 2])
  with pytest.raises(CheckpointError, match="could not be read as a torch checkpoint"):
    load_original(str(path), CONFIG)


def test_pickled_code_is_refused(tmp_path):
  torch = pytest.importorskip("torch")
  path = tmp_path / "evil.ckpt"
  torch.save({"state_dict": {}, "payload": shutil.rmtree}, path)  # a pickled callable
  with pytest.raises(CheckpointError, match="weights-only"):
    load_original(str(path), CONFIG)


def test_missing_files(tmp_path):
  with pytest.raises(CheckpointError, match="No such checkpoint file"):
    load_original(str(tmp_path / "nope.ckpt"), CONFIG)
  with pytest.raises(FileNotFoundError, match="No config.json"):
    load_original(SAFE, str(tmp_path / "config.json"))
  with pytest.raises(CheckpointError, match="No such directory"):
    load_hf_llama(str(tmp_path / "nope"))
  with pytest.raises(CheckpointError, match="pass the base model's config.json"):
    lonely = tmp_path / "lonely.safetensors"
    shutil.copy(SAFE, lonely)
    load_model(str(lonely))


def test_not_a_safetensors_file(tmp_path):
  path = tmp_path / "junk.safetensors"
  path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
  with pytest.raises(CheckpointError, match="corrupt safetensors header"):
    load_original(str(path), CONFIG)


def test_torch_absent_gives_install_hint(monkeypatch):
  real_import = builtins.__import__

  def no_torch(name, *args, **kw):
    if name == "torch":
      raise ImportError("No module named 'torch'")
    return real_import(name, *args, **kw)
  monkeypatch.setattr(builtins, "__import__", no_torch)
  with pytest.raises(CheckpointError, match="needs PyTorch.*convert the checkpoint to .safetensors"):
    load_original(CKPT, CONFIG)


def test_hf_dir_errors(tmp_path):
  (tmp_path / "config.json").write_text(open(CONFIG).read())
  with pytest.raises(CheckpointError, match="neither model.safetensors"):
    load_hf_llama(str(tmp_path))
  (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
  with pytest.raises(CheckpointError, match="pickle weights"):
    load_hf_llama(str(tmp_path))
  cfg = json.loads(open(CONFIG).read())
  del cfg["hidden_size"]
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match="lacks the field 'hidden_size'"):
    load_hf_llama(str(tmp_path))


def test_native_export_roundtrip_and_errors(tmp_path):
  import jax
  cfg, params = load_original(SAFE, CONFIG)
  save_hamburger(str(tmp_path / "full"), cfg, params)
  cfg2, params2 = load_hamburger(str(tmp_path / "full"))
  assert cfg2 == cfg
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(params2)):
    np.testing.assert_array_equal(a, b)
  # A grafted-only export needs the base params, and says so.
  save_hamburger(str(tmp_path / "grafted"), cfg, params, subset="embedder,micro_decoder")
  with pytest.raises(CheckpointError, match="pass the base model's params"):
    load_hamburger(str(tmp_path / "grafted"))
  _, params3 = load_hamburger(str(tmp_path / "grafted"), base_params=params["base"])
  np.testing.assert_array_equal(params3["embedder"]["pos"], params["embedder"]["pos"])
  # A config that does not match the weights.
  bad = json.loads((tmp_path / "full" / "hamburger_config.json").read_text())
  bad["base"]["hidden_size"] = 32
  bad["merger_heads"] = 32
  (tmp_path / "full" / "hamburger_config.json").write_text(json.dumps(bad))
  with pytest.raises(CheckpointError, match="has shape .* the config expects"):
    load_hamburger(str(tmp_path / "full"))
  bad["surprise"] = 1
  (tmp_path / "full" / "hamburger_config.json").write_text(json.dumps(bad))
  with pytest.raises(CheckpointError, match="Unknown HamburgerConfig keys"):
    load_hamburger(str(tmp_path / "full"))
