"""Offline instruction prompts derived from the Python standard library.

Three kinds of prompt, all built from the running interpreter's own modules (no download):
  write    "Write a Python function `name(sig)` that ...": from a function's docstring
  explain  "Explain what this Python code does: ...": from a short function's source
  describe "What does `module.name` do in Python?": from a documented function's name

Each prompt gets a stable split ("train" or "heldout") from a hash of its function's qualified
name, so held-out functions never appear in training prompts of any kind.

    python -m hamburger_jax.recipes.stdlib_prompts --out prompts.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import textwrap
import warnings
from typing import Iterator

# Pure-Python modules that import quickly, have no side effects and have readable sources.
MODULES = (
    "abc argparse ast base64 bisect calendar cmd codecs collections colorsys configparser "
    "contextlib copy csv dataclasses datetime decimal difflib dis email.utils enum filecmp "
    "fnmatch fractions ftplib functools getopt gettext glob graphlib gzip hashlib heapq hmac "
    "html html.parser http.cookies imaplib inspect io ipaddress json keyword linecache locale "
    "logging mailbox mimetypes netrc numbers operator optparse os os.path pathlib pickle pkgutil "
    "platform plistlib poplib posixpath pprint queue quopri random re reprlib sched secrets "
    "selectors shelve shlex shutil smtplib socketserver statistics string stringprep struct "
    "subprocess tabnanny tarfile tempfile textwrap threading timeit tokenize trace traceback "
    "types typing urllib.parse urllib.request uu uuid warnings wave weakref xml.dom.minidom "
    "zipapp zipfile").split()

MAX_SOURCE_LINES = 25


def split_of(qualname: str, heldout_fraction: float = 0.1) -> str:
  h = int(hashlib.sha256(qualname.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
  return "heldout" if h < heldout_fraction else "train"


def _functions(module_name: str) -> Iterator[tuple[str, object]]:
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
      module = importlib.import_module(module_name)
    except Exception:  # a module missing on this platform is simply skipped
      return
  for name, obj in sorted(vars(module).items()):
    if name.startswith("_"):
      continue
    if inspect.isfunction(obj) and obj.__module__ == module.__name__:
      yield f"{module_name}.{name}", obj
    elif inspect.isclass(obj) and obj.__module__ == module.__name__:
      for meth_name, meth in sorted(vars(obj).items()):
        if not meth_name.startswith("_") and inspect.isfunction(meth):
          yield f"{module_name}.{name}.{meth_name}", meth


def _first_paragraph(doc: str) -> str:
  para = inspect.cleandoc(doc).split("\n\n")[0]
  return " ".join(para.split())


def prompts_for(qualname: str, fn) -> list[dict]:
  """The prompts one function yields (possibly none)."""
  doc = inspect.getdoc(fn)
  out = []
  short_name = qualname.rsplit(".", 1)[1]
  try:
    sig = str(inspect.signature(fn))
  except (TypeError, ValueError):
    sig = "(...)"
  base = {"function": qualname, "split": split_of(qualname)}
  if doc and 20 <= len(_first_paragraph(doc)) <= 400:
    summary = _first_paragraph(doc)
    out.append({**base, "kind": "write",
                "prompt": f"Write a Python function `{short_name}{sig}` that does the following: "
                          f"{summary}"})
    out.append({**base, "kind": "describe",
                "prompt": f"What does `{qualname}` do in Python? Answer briefly."})
  try:
    source = textwrap.dedent(inspect.getsource(fn))
  except (OSError, TypeError):
    source = None
  if source and 3 <= source.count("\n") <= MAX_SOURCE_LINES:
    out.append({**base, "kind": "explain",
                "prompt": f"Explain what this Python code does:\n```python\n{source.rstrip()}\n```"})
  return out


def stdlib_prompts(modules=MODULES) -> list[dict]:
  """All prompts, in a deterministic order, each {prompt, kind, function, split}."""
  seen, out = set(), []
  for module_name in modules:
    for qualname, fn in _functions(module_name):
      for p in prompts_for(qualname, fn):
        if p["prompt"] not in seen:
          seen.add(p["prompt"])
          out.append(p)
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="output JSONL path")
  args = parser.parse_args(argv)
  prompts = stdlib_prompts()
  with open(args.out, "w") as f:
    for p in prompts:
      f.write(json.dumps(p) + "\n")
  counts = {}
  for p in prompts:
    counts[(p["split"], p["kind"])] = counts.get((p["split"], p["kind"]), 0) + 1
  print(json.dumps({"prompts": len(prompts),
                    "by_split_kind": {f"{s}/{k}": n for (s, k), n in sorted(counts.items())}}))


if __name__ == "__main__":
  main()
