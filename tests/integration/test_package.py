"""The package's edges: console entry points resolve, subpackages import only in the documented
direction (model/ needs nothing else of the package), and package data is declared."""

import ast
import importlib
import os
import tomllib

from tests.fixture_paths import REPO


def _pyproject() -> dict:
  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)


def test_entry_points_resolve():
  scripts = _pyproject()["project"]["scripts"]
  assert set(scripts) == {"hamburger-train", "hamburger-decode", "hamburger-serve"}
  for target in scripts.values():
    module, _, name = target.partition(":")
    assert callable(getattr(importlib.import_module(module), name)), target


# Subpackage -> the other subpackages its modules may import (the architecture's direction).
ALLOWED = {
    "model": set(),
    "text": {"convert"},                       # GGUF tokenizers read GGUF files
    "convert": {"model"},
    "decode": {"model", "convert", "text", "testing", "shipped"},  # shipped: --ckpt smollm2
    "data": {"model", "text", "decode"},       # distillation decodes with the base model
    "train": {"model", "data", "convert"},
    "testing": {"model", "convert"},
    "serve": {"model", "decode", "text", "convert"},
    "shipped": {"convert", "text"},            # the shipped model's files and loaders
}


def _imported_subpackages(pkg: str) -> dict[str, set[str]]:
  """module file -> hamburger_jax subpackages it imports (module level or inside functions)."""
  out = {}
  root = os.path.join(REPO, "hamburger_jax", pkg)
  for name in sorted(os.listdir(root)):
    if not name.endswith(".py"):
      continue
    with open(os.path.join(root, name)) as f:
      tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
      mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
              [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
      for m in mods:
        parts = m.split(".")
        if parts[0] == "hamburger_jax" and len(parts) > 1:
          found.add(parts[1])
    out[name] = found - {pkg}
  return out


# AOT TPU plans compile the train step and the decode loop alike; decoding on a mesh builds it
# and its logical-axis shardings with training's one owner of them (train/sharding.py).
EXCEPTIONS = {("train", "aot.py"): {"decode"}, ("decode", "mesh.py"): {"train"}}


def test_import_direction():
  for pkg, allowed in ALLOWED.items():
    for module, used in _imported_subpackages(pkg).items():
      allowed_here = allowed | EXCEPTIONS.get((pkg, module), set())
      assert used <= allowed_here, f"hamburger_jax/{pkg}/{module} imports {sorted(used - allowed_here)}"


def test_package_data_declared():
  data = _pyproject()["tool"]["setuptools"]["package-data"]["hamburger_jax"]
  assert "assets/*/*" in data and "recipes/*.txt" in data
  assert os.path.isfile(os.path.join(REPO, "hamburger_jax", "recipes", "broad_templates.txt"))
