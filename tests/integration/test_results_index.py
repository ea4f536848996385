"""docs/results/ stays one navigable record: the index lists every log, every file is linked from
the index or a log it lists, every link resolves, and every JSON carries its provenance."""

import json
import os
import re
import tomllib

from tests.fixture_paths import REPO

RESULTS = os.path.join(REPO, "docs", "results")
INDEX = os.path.join(RESULTS, "README.md")
PROVENANCE_KEYS = {"command", "commit", "date", "machine"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")   # [text](target) and ![alt](target)


def _links(md_path: str) -> list[str]:
  """Relative link targets of a markdown file -> absolute paths (URLs and anchors left out)."""
  with open(md_path, encoding="utf-8") as f:
    targets = LINK.findall(f.read())
  local = (t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:", t))
  return [os.path.normpath(os.path.join(os.path.dirname(md_path), t)) for t in local if t]


def _files_under_results() -> set[str]:
  return {os.path.join(root, name) for root, _, names in os.walk(RESULTS) for name in names}


def _logs() -> set[str]:
  return {os.path.join(RESULTS, name) for name in os.listdir(RESULTS)
          if name.endswith(".md") and name != "README.md"}


def test_index_lists_every_log():
  listed = set(_links(INDEX))
  assert _logs(), "docs/results holds no log"
  assert sorted(_logs() - listed) == []


def test_every_file_is_linked_from_the_index_or_a_listed_log():
  listed_logs = set(_links(INDEX)) & _logs()
  linked = set(_links(INDEX)).union(*(_links(log) for log in listed_logs))
  unlinked = sorted(os.path.relpath(p, REPO) for p in _files_under_results() - linked - {INDEX})
  assert unlinked == []


def test_every_link_resolves():
  broken = [f"{os.path.relpath(md, REPO)} -> {os.path.relpath(target, REPO)}"
            for md in sorted(_logs() | {INDEX}) for target in _links(md)
            if not os.path.exists(target)]
  assert broken == []


def test_every_json_parses_with_provenance():
  for path in sorted(p for p in _files_under_results() if p.endswith(".json")):
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
    name = os.path.relpath(path, REPO)
    assert isinstance(data, dict) and isinstance(data.get("provenance"), dict), name
    assert set(data["provenance"]) >= PROVENANCE_KEYS, name
    assert all(isinstance(data["provenance"][k], str) and data["provenance"][k]
               for k in PROVENANCE_KEYS), name


def test_distilled_answers_ship_beside_their_recipe():
  data = os.path.join(REPO, "hamburger_jax", "recipes", "data", "smollm2_v2_sft.jsonl.gz")
  assert os.path.isfile(data)
  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    package_data = tomllib.load(f)["tool"]["setuptools"]["package-data"]["hamburger_jax"]
  assert "recipes/data/*" in package_data
