"""The decoding commands' persistent compilation cache (`decode/persistent_cache.py`): where it
lives, and a second decode.py run that reads its programs back instead of compiling them."""

import os
import subprocess
import sys

import jax
import pytest

from hamburger_jax.decode import persistent_cache
from hamburger_jax.testing.fixtures import make_tiny_checkpoint
from tests.fixture_paths import REPO


def test_default_directory_follows_the_environment(monkeypatch, tmp_path):
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
  assert persistent_cache.default_directory() == str(tmp_path / "jax")
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert persistent_cache.default_directory() == str(tmp_path / "xdg" / "hamburger_jax" / "xla")
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert persistent_cache.default_directory() == str(
      tmp_path / "home" / ".cache" / "hamburger_jax" / "xla")


def test_enable_turns_the_cache_on_at_a_directory_and_an_empty_one_off(tmp_path):
  before = {name: getattr(jax.config, name)
            for name in ("jax_enable_compilation_cache", "jax_compilation_cache_dir")}
  try:
    assert persistent_cache.enable(str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")
    assert os.path.isdir(tmp_path / "a" / "b")
    assert getattr(jax.config, "jax_compilation_cache_dir") == str(tmp_path / "a" / "b")
    assert getattr(jax.config, "jax_enable_compilation_cache")
    assert persistent_cache.enable("") is None
    assert not getattr(jax.config, "jax_enable_compilation_cache")
    (tmp_path / "file").write_text("")
    warnings = []
    assert persistent_cache.enable(str(tmp_path / "file" / "x"), warnings.append) is None
    assert not getattr(jax.config, "jax_enable_compilation_cache")
    assert len(warnings) == 1 and str(tmp_path / "file" / "x") in warnings[0], warnings
    assert "cannot be made" in warnings[0] and "--compilation_cache" in warnings[0]
  finally:
    for name, value in before.items():
      jax.config.update(name, value)


def _decode_py(home, *args):
  """decode.py on a tiny checkpoint with HOME at `home` and no cache directory in the
  environment; compiles and cache hits logged (JAX_LOG_COMPILES)."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME")}
  env.update(JAX_PLATFORMS="cpu", HOME=str(home), JAX_LOG_COMPILES="1",
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  out = subprocess.run([sys.executable, os.path.join(REPO, "decode.py"), *args], env=env,
                       cwd=REPO, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


HIT = "Persistent compilation cache hit for 'jit_loop'"


@pytest.mark.slow
def test_a_second_run_reads_the_decode_loop_from_the_default_cache(tmp_path):
  ckpt = make_tiny_checkpoint(str(tmp_path / "ckpt"))
  args = ("--ckpt", ckpt, "--token_ids", "--prompt", "1,5,7", "--max_new_tokens", "8")
  first = _decode_py(tmp_path / "home", *args)
  cache = tmp_path / "home" / ".cache" / "hamburger_jax" / "xla"
  assert HIT not in first.stderr and os.listdir(cache)
  second = _decode_py(tmp_path / "home", *args)
  assert HIT in second.stderr and second.stdout == first.stdout
