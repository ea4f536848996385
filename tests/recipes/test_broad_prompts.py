"""Broad offline prompts: deterministic, varied, split by item without leaks, CLI files and errors."""

import gzip
import hashlib
import json
import os
import subprocess
import sys

import pytest

from hamburger_jax.recipes import broad_prompts as bp
from hamburger_jax.recipes import stdlib_prompts as sp

from tests.fixture_paths import REPO
DIGEST = ("import hashlib, json; from hamburger_jax.recipes.broad_prompts import broad_prompts; "
          "print(hashlib.sha256(json.dumps(broad_prompts()).encode()).hexdigest())")


@pytest.fixture(scope="module")
def prompts():
  return bp.broad_prompts()


def test_deterministic_across_processes(prompts):
  # Another interpreter with another str-hash seed builds exactly the same list.
  env = {**os.environ, "PYTHONHASHSEED": "12345"}
  out = subprocess.run([sys.executable, "-c", DIGEST], cwd=REPO, env=env, check=True,
                       capture_output=True, text=True).stdout.split()[-1]
  assert out == hashlib.sha256(json.dumps(prompts).encode()).hexdigest()


def test_varied_distinct_and_short(prompts):
  kinds = {p["kind"] for p in prompts}
  assert len(kinds) >= 6
  train = {p["prompt"] for p in prompts if p["split"] == "train"}
  assert len(train) >= 10_000
  assert len({p["prompt"] for p in prompts}) == len(prompts)          # deduplicated
  for kind in kinds:                # every kind can fill 1/9 of 10,000 training prompts
    assert sum(p["kind"] == kind and p["split"] == "train" for p in prompts) >= 1100, kind
  assert sum(p["split"] == "heldout" for p in prompts) >= 300
  assert max(len(p["prompt"]) for p in prompts) <= bp.MAX_CHARS
  assert all(p["source"] and set(p["source"].split("+")) <= set(bp.SOURCES) for p in prompts)


def test_heldout_items_never_in_train(prompts):
  keys = {k for p in prompts for k in p["item"].split("|")}
  heldout = {k for k in keys if sp.split_of(k, bp.HELDOUT_FRACTION) == "heldout"}
  train = {k for p in prompts if p["split"] == "train" for k in p["item"].split("|")}
  assert len(heldout) > 100 and not train & heldout
  # A prompt is held out exactly when one of its items is (items pair up in some templates).
  for p in prompts:
    assert (p["split"] == "heldout") == bool(heldout & set(p["item"].split("|")))


def test_prompts_fit_the_recipe_token_limit(prompts):
  # The distill step drops prompts over 128 tokens (ChatML + SmolLM2's default system prompt):
  # broad prompts fit by construction, stdlib ones (code) are filtered by token count.
  from hamburger_jax.recipes import smollm2
  try:
    smollm2.gguf_path()
  except FileNotFoundError as e:
    pytest.skip(str(e))
  longest = sorted(prompts, key=lambda p: -len(p["prompt"]))[:500]
  assert bp.fitting(longest, 128) == longest
  code = [{"prompt": "Explain:\n" + "    x = 1\n" * 40}, {"prompt": "Hi"}]
  assert bp.fitting(code, 128) == code[1:]


def _read(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def _cli(tmp_path, *flags):
  bp.main(["--workdir", str(tmp_path), "--num_train", "180", "--num_heldout", "40",
           "--mix_stdlib", "18", "--max_prompt_tokens", "0", *flags])


def test_cli_writes_balanced_files(prompts, tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(bp, "broad_prompts", lambda: prompts)
  small = sp.stdlib_prompts(("textwrap", "json", "heapq", "bisect", "calendar", "shlex"))
  monkeypatch.setattr(sp, "stdlib_prompts", lambda: small)
  _cli(tmp_path)
  train, held = _read(tmp_path / "prompts_train.jsonl"), _read(tmp_path / "prompts_heldout.jsonl")
  assert len(train) == 180 and len(held) == 40
  assert all(p["split"] == "train" for p in train) and all(p["split"] == "heldout" for p in held)
  assert not {p["prompt"] for p in train} & {p["prompt"] for p in held}
  counts = {}
  for p in train:
    counts[p["kind"]] = counts.get(p["kind"], 0) + 1
  assert sum(n for k, n in counts.items() if k.startswith("stdlib_")) == 18
  assert sum(p["kind"].startswith("stdlib_") for p in held) == 4       # the same share
  broad = [n for k, n in counts.items() if not k.startswith("stdlib_")]
  assert len(broad) >= 6 and max(broad) - min(broad) <= 1          # kinds balanced
  assert "by_split_kind" in json.loads(capsys.readouterr().out)
  first = (tmp_path / "prompts_train.jsonl").read_text()
  _cli(tmp_path)
  assert (tmp_path / "prompts_train.jsonl").read_text() == first   # same flags, same file


@pytest.mark.parametrize("flags, words", [
    (["--num_train", "-5"], "--num_train"),
    (["--num_train", "abc"], "--num_train"),
    (["--num_train", "10", "--mix_stdlib", "50"], "--mix_stdlib"),
    (["--num_train", "10000000"], "train prompts exist"),
    (["--num_train", "100000", "--mix_stdlib", "90000"], "stdlib train prompts exist"),
    (["--max_prompt_tokens", "-1"], "--max_prompt_tokens"),
    (["--bogus"], "--bogus"),
])
def test_bad_flags_one_line_exit_2(flags, words, prompts, tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(bp, "broad_prompts", lambda: prompts)
  monkeypatch.setattr(bp, "stdlib_records", lambda: [])
  with pytest.raises(SystemExit) as e:
    bp.main(["--workdir", str(tmp_path), "--max_prompt_tokens", "0"] + flags)
  err = capsys.readouterr().err
  assert e.value.code == 2 and words in err and err.count("\n") == 1
  assert not os.path.exists(tmp_path / "prompts_train.jsonl")


def test_stdlib_records_drop_memory_addresses(monkeypatch):
  # A default shown as `<object object at 0x7f...>` differs from run to run: such prompts go.
  fake = [{"prompt": "Write `f(x=<object object at 0x7f84727eca70>)`", "kind": "write",
           "function": "m.f", "split": "train"},
          {"prompt": "What does `m.g` do in Python?", "kind": "describe", "function": "m.g",
           "split": "heldout"}]
  monkeypatch.setattr(sp, "stdlib_prompts", lambda: fake)
  assert bp.stdlib_records() == [{"prompt": fake[1]["prompt"], "kind": "stdlib_describe",
                                  "source": "python", "split": "heldout", "item": "m.g"}]


def test_exclude_answered_leaves_out_distilled_prompts(prompts, tmp_path, monkeypatch):
  monkeypatch.setattr(bp, "broad_prompts", lambda: prompts)
  monkeypatch.setattr(bp, "stdlib_records", lambda: [])
  first = tmp_path / "first"
  bp.main(["--workdir", str(first), "--num_train", "300", "--num_heldout", "0",
           "--max_prompt_tokens", "0"])
  answered = tmp_path / "sft.jsonl.gz"

  with gzip.open(answered, "wt") as f:
    for p in _read(first / "prompts_train.jsonl"):
      f.write(json.dumps({"prompt": p["prompt"], "response": "x", "finish": "eos"}) + "\n")
  more = tmp_path / "more"
  bp.main(["--workdir", str(more), "--num_train", "300", "--num_heldout", "0",
           "--max_prompt_tokens", "0", "--exclude_answered", str(answered)])
  old, new = _read(first / "prompts_train.jsonl"), _read(more / "prompts_train.jsonl")
  assert len(new) == 300 and not {p["prompt"] for p in old} & {p["prompt"] for p in new}


def test_exclude_answered_bad_file_one_line_exit_2(prompts, tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(bp, "broad_prompts", lambda: prompts)
  bad = tmp_path / "answers.jsonl"
  bad.write_text('{"response": "no prompt here"}\n')
  for path, words in ((bad, "without a \"prompt\""), (tmp_path / "missing.jsonl", "No such")):
    with pytest.raises(SystemExit) as e:
      bp.main(["--workdir", str(tmp_path / "out"), "--max_prompt_tokens", "0",
               "--exclude_answered", str(path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and words in err and err.count("\n") == 1
  assert not os.path.exists(tmp_path / "out" / "prompts_train.jsonl")
