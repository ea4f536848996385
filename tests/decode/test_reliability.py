"""Bad inputs (issue cases 3, 4, 5): checkpoints whose config and weights disagree, NaN weights,
mistyped config fields, string/float prompt ids, non-UTF-8 prompts, huge sizes and seeds,
infinite temperature: each is refused with one clear message (exit code 2 on the command line)."""

import io
import json
import re
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.fixture_paths import OFFICIAL_TINY
from hamburger_jax.convert import CheckpointError, load_model, load_original
from hamburger_jax.convert.safetensors_io import read_safetensors, write_safetensors
from hamburger_jax.decode.cli import DecodeArgs, UsageError, check_buffer_memory, run
from hamburger_jax.decode.prompts import DecodeInputError, token_ids, utf8_text
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.testing.fixtures import make_tiny_checkpoint

from tests.fixture_paths import REPO


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  return make_tiny_checkpoint(str(tmp_path_factory.mktemp("inputs") / "tiny"))


def _edited_copy(ckpt, tmp_path, edit_config=None, edit_params=None):
  out = tmp_path / "edited"
  shutil.copytree(ckpt, out)
  if edit_config:
    cfg = json.loads((out / "hamburger_config.json").read_text())
    edit_config(cfg)
    (out / "hamburger_config.json").write_text(json.dumps(cfg))
  if edit_params:
    tensors, meta = read_safetensors(out / "params.safetensors")
    tensors = {k: np.array(v) for k, v in tensors.items()}
    edit_params(tensors)
    write_safetensors(out / "params.safetensors", tensors, meta)
  return str(out)


def _run(**kwargs):
  out, err = io.StringIO(), io.StringIO()
  stdin = kwargs.pop("stdin", io.StringIO(""))
  code = run(DecodeArgs(**kwargs), stdout=out, stderr=err, stdin=stdin)
  return code, out.getvalue(), err.getvalue()


# --- strict config / weight agreement ----------------------------------------------------------

def _set_base(field, value):
  return lambda cfg: cfg["base"].__setitem__(field, value)


@pytest.mark.parametrize("edit, message", [
    (_set_base("num_layers", 3), r"does not use: \['base/layers_3/.*it holds 4 layers under "
                                 r"base/layers but the config gives 3"),
    (lambda c: c.__setitem__("num_micro_layers", 2),
     r"does not use: .*it holds 4 layers under micro_decoder/layers but the config gives 2"),
    (_set_base("num_layers", 5), r"lacks \['base/layers_4/.*it holds 4 layers under base/layers "
                                 r"but the config gives 5: its config and weights disagree"),
    (_set_base("vocab_size", 256.0), r"vocab_size must be an integer, got 256.0"),
    (_set_base("vocab_size", "256"), r"vocab_size must be an integer, got '256'"),
    (lambda c: c.__setitem__("max_steps", 4.5), r"max_steps must be an integer, got 4.5"),
])
def test_export_whose_config_and_weights_disagree(ckpt, tmp_path, edit, message):
  with pytest.raises(CheckpointError, match=message):
    load_model(_edited_copy(ckpt, tmp_path, edit_config=edit))


def test_nan_weights_are_refused_on_load_and_by_decode(ckpt, tmp_path):
  def poison(t):
    t["base/norm/scale"][3] = np.nan
  bad = _edited_copy(ckpt, tmp_path, edit_params=poison)
  with pytest.raises(CheckpointError, match=r"base/norm/scale holds 1 NaN/inf values"):
    load_model(bad)
  code, out, err = _run(ckpt=bad, prompt="1,5,7", token_ids=True, json=True)
  assert code == 2 and out == "" and err.count("\n") == 1 and "NaN/inf" in err


def test_original_checkpoint_with_fewer_layers_in_its_config(tmp_path):
  cfg = json.loads(open(os.path.join(OFFICIAL_TINY, "config.json")).read())
  cfg["num_hidden_layers"] = 12
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(CheckpointError, match=r"does not use: \['model.model.layers.12.*16 layers "
                                            r"under model.model.layers but the config gives 12"):
    load_original(os.path.join(OFFICIAL_TINY, "tiny_official.safetensors"),
                  str(tmp_path / "config.json"))


def test_original_tied_copies_and_optimizer_state_are_still_accepted(tmp_path):
  tensors, meta = read_safetensors(os.path.join(OFFICIAL_TINY, "tiny_official.safetensors"))
  tensors = {k: np.array(v) for k, v in tensors.items()}
  tensors["optimizer.state.0.exp_avg"] = np.zeros((3,), np.float32)
  tensors["comp_embedder.embedding.weight"] = tensors["model.model.embed_tokens.weight"]
  write_safetensors(tmp_path / "ok.safetensors", tensors, meta)
  load_original(str(tmp_path / "ok.safetensors"), os.path.join(OFFICIAL_TINY, "config.json"))
  tensors["comp_embedder.embedding.weight"] = tensors["comp_embedder.embedding.weight"] + 1.0
  write_safetensors(tmp_path / "untied.safetensors", tensors, meta)
  with pytest.raises(CheckpointError, match=r"does not use: \['comp_embedder.embedding.weight'\]"):
    load_original(str(tmp_path / "untied.safetensors"), os.path.join(OFFICIAL_TINY, "config.json"))


@pytest.mark.parametrize("value", [64.0, "64"])
def test_hf_config_sizes_must_be_integers(tmp_path, value):
  cfg = json.loads(open(os.path.join(OFFICIAL_TINY, "config.json")).read())
  cfg["hidden_size"] = value
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(CheckpointError, match=r"hidden_size must be a positive integer"):
    load_original(os.path.join(OFFICIAL_TINY, "tiny_official.safetensors"),
                  str(tmp_path / "config.json"))


# --- typed prompts ----------------------------------------------------------------------------

def test_sampler_refuses_string_float_and_bool_ids(ckpt):
  _, cfg, params = load_model(ckpt)
  sampler = Sampler(cfg, params, cache_length=64)
  with pytest.raises(DecodeInputError, match=r"Prompt 0 is a str \('157'\): give a list"):
    sampler.decode(["157"], max_new_tokens=4)
  with pytest.raises(DecodeInputError, match=r"Prompt 1 element 1 is 5.7 \(float\)"):
    sampler.check_prompts([[1, 2], [1, 5.7]])
  with pytest.raises(DecodeInputError, match=r"element 0 is True \(bool\)"):
    sampler.check_prompts([[True, 5]])
  assert sampler.check_prompts([np.array([1, 5, 7], np.int64)]) == [[1, 5, 7]]
  assert token_ids((np.int32(3), 4), 0) == [3, 4]
  with pytest.raises(DecodeInputError, match="seed must be an integer"):
    sampler.decode([[1, 5]], max_new_tokens=4, seed=2**64)


def test_non_utf8_prompts_file_stdin_and_argument(ckpt, tmp_path):
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"caf\xe9\n")
  code, _, err = _run(ckpt=ckpt, prompt_file=str(bad))
  assert code == 2 and "is not valid UTF-8 (byte e9 at offset 3)" in err and err.count("\n") == 1
  stdin = io.TextIOWrapper(io.BytesIO(b"\xff\xfe1,2\n"))
  code, _, err = _run(ckpt=ckpt, stdin=stdin)
  assert code == 2 and "The text on stdin is not valid UTF-8" in err
  argv_text = b"caf\xe9".decode("utf-8", "surrogateescape")       # how Python passes argv bytes
  with pytest.raises(DecodeInputError, match=r"The prompt is not valid UTF-8 \(byte e9"):
    utf8_text(argv_text, "The prompt")
  proc = subprocess.run([sys.executable, "decode.py", "--ckpt", ckpt, b"caf\xe9"], cwd=REPO,
                        capture_output=True, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                        timeout=300)
  assert proc.returncode == 2 and proc.stderr.decode().startswith("error: The prompt is not valid")


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_new_tokens=100_000_000), r"--max_new_tokens must be in 1..1048576"),
    (dict(seed=10**30), r"seed must be an integer in 0..4294967295"),
    (dict(seed=-1), r"seed must be an integer in 0..4294967295"),
    (dict(temperature=float("inf")), r"temperature must be a finite number >= 0"),
    (dict(cache_length=-5), r"--cache_length must be in 0..1048576"),
])
def test_sizes_seeds_and_temperature(ckpt, kwargs, message):
  code, out, err = _run(ckpt=ckpt, prompt="1,5", token_ids=True, **kwargs)
  assert code == 2 and out == "" and err.count("\n") == 1
  assert err.startswith("error: ") and re.search(message, err)


def test_kv_buffer_larger_than_the_device_is_refused(ckpt):
  _, cfg, _ = load_model(ckpt)
  with pytest.raises(UsageError, match=r"needs 1.0 GiB but the device has 0.5 GiB: lower "
                                       r"--max_new_tokens"):
    check_buffer_memory(cfg.base, 1, 2**20, available=2**29)   # K,V x 4 layers x 2 x 16 x 4 B
  check_buffer_memory(cfg.base, 1, 1024, available=2**30)
