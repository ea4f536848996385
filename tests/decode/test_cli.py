"""decode.py end to end (subprocesses on a tiny checkpoint written by the documented command) and
its handling of bad input (exit code 2, one clear line, no traceback)."""

import io
import json
import os
import subprocess
import sys

import jax
import pytest

from hamburger_jax.convert import load_model
from hamburger_jax.decode.cli import DecodeArgs, run
from hamburger_jax.decode.sampler import Sampler
from tests.text.test_tokenizer import CHATML, write_word_tokenizer

from tests.fixture_paths import REPO


def _decode_py(*args, stdin=None):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, os.path.join(REPO, "decode.py"), *args], input=stdin,
                        capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("cli") / "tiny_ckpt")
  proc = _decode_py("--make_tiny_checkpoint", path)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == path
  assert sorted(os.listdir(path)) == ["hamburger_config.json", "params.safetensors"]
  return path


def _run(stdin="", **kwargs):
  out, err = io.StringIO(), io.StringIO()
  code = run(DecodeArgs(**kwargs), stdout=out, stderr=err, stdin=io.StringIO(stdin))
  return code, out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_token_ids_json_end_to_end(ckpt):
  # The README's form: the prompt ids as a positional argument after --token_ids.
  proc = _decode_py("--ckpt", ckpt, "--token_ids", "1,5,7", "--json",
                    "--max_new_tokens", "12", "--confidence", "0.5")
  assert proc.returncode == 0, proc.stderr
  out = json.loads(proc.stdout)
  row = out["outputs"][0]
  assert row["prompt_ids"] == [1, 5, 7]
  assert sum(map(len, row["groups"])) == len(row["tokens"])
  stats = out["stats"]
  for key in ("prompt_tokens", "new_tokens", "macro_steps", "tokens_per_macro_step",
              "kv_slots_used", "kv_slots_base", "prefill_s", "decode_tokens_per_s", "compile_s"):
    assert key in stats
  assert stats["prompt_tokens"] == 3 and stats["new_tokens"] == len(row["tokens"])
  assert stats["macro_steps"] == len(row["groups"]) and stats["mode"] == "hamburger"
  assert stats["compile_s"] > 0
  assert stats["kv_slots_used"] == stats["prompt_tokens"] + stats["macro_steps"] - 1
  code, text, err = _run(ckpt=ckpt, token_ids=True, prompt="1,5,7", json=True, compare_base=True,
                         max_new_tokens=12, confidence=0.5)
  assert code == 0, err
  assert set(json.loads(text)["stats"]["base"]) >= {"decode_tokens_per_s", "speed_ratio",
                                                   "kv_slots", "token_agreement"}
  # The CLI decodes exactly what the library decodes.
  _, cfg, params = load_model(ckpt)
  ref = Sampler(cfg, params, cache_length=64, out_length=64).decode(
      [[1, 5, 7]], max_new_tokens=12, confidence=0.5)
  assert row["tokens"] == ref.tokens[0] and row["groups"] == ref.groups(0)
  assert row["finish_reason"] == ref.finish_reasons[0]


@pytest.mark.slow
def test_streamed_text_with_groups_and_stdin_batch(ckpt):
  proc = _decode_py("--ckpt", ckpt, "--token_ids", "--prompt", "1,5,7", "--show_groups",
                    "--max_new_tokens", "12", "--confidence", "0.5", "--stream_steps", "2")
  assert proc.returncode == 0, proc.stderr
  _, cfg, params = load_model(ckpt)
  ref = Sampler(cfg, params, cache_length=64, out_length=64).decode(
      [[1, 5, 7], [1, 9]], max_new_tokens=12, confidence=0.5)
  expected = " ".join("[" + " ".join(str(t) for t in g) + "]" for g in ref.groups(0))
  assert proc.stdout.strip() == expected                    # no ANSI colors: not a tty
  assert "new tokens in" in proc.stderr and "KV slots" in proc.stderr
  proc = _decode_py("--ckpt", ckpt, "--token_ids", "--max_new_tokens", "12", "--confidence",
                    "0.5", "--json", stdin="1,5,7\n\n1,9\n")
  assert proc.returncode == 0, proc.stderr
  rows = json.loads(proc.stdout)["outputs"]
  assert [r["tokens"] for r in rows] == ref.tokens


@pytest.mark.slow
def test_base_mode_and_prompt_file(ckpt, tmp_path):
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("1,5,7\n1,9,9,9\n")
  code, out, err = _run(ckpt=ckpt, token_ids=True, prompt_file=str(prompts), base=True,
                        max_new_tokens=10, json=True)
  assert code == 0, err
  out = json.loads(out)
  assert out["stats"]["mode"] == "base" and len(out["outputs"]) == 2
  for row in out["outputs"]:
    assert all(len(g) == 1 for g in row["groups"])
  assert out["stats"]["kv_slots_used"] == out["stats"]["kv_slots_base"]


def test_tokenizer_chat_and_groups_in_process(ckpt, tmp_path):
  tok = write_word_tokenizer(tmp_path, CHATML)
  code, out, err = _run(ckpt=ckpt, tokenizer=tok, prompt="hello world", chat=True,
                        max_new_tokens=8, json=True, confidence=0.5)
  assert code == 0, err
  row = json.loads(out)["outputs"][0]
  assert len(row["prompt_ids"]) == 7 and "text" in row
  code, out, err = _run(ckpt=ckpt, tokenizer=tok, prompt="hello world", chat=True,
                        max_new_tokens=8, show_groups=True, confidence=0.5)
  assert code == 0, err
  assert out.startswith("[") and out.rstrip().endswith("]") and "\x1b[" not in out
  # On a terminal, groups are closed by a dim bar and tokens colored by probability.
  tty = _TTY()
  args = DecodeArgs(ckpt=ckpt, token_ids=True, prompt="1,5,7", max_new_tokens=8, show_groups=True,
                    confidence=0.5)
  assert run(args, stdout=tty, stderr=io.StringIO()) == 0
  colored = tty.getvalue()
  assert "\x1b[38;5;" in colored and colored.count("\x1b[2m|") >= 2


class _TTY(io.StringIO):
  def isatty(self):
    return True


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt=""), "empty"),
    (dict(prompt=" , "), "Prompt 0 is empty"),
    (dict(prompt="1,x"), "not a comma-separated list of token ids"),
    (dict(prompt="1,2,3,4,5,6", cache_length=4), "KV buffer holds 4 slots"),
    (dict(prompt="1,5", confidence=0.0), "--confidence must be in (0, 1]"),
    (dict(prompt="1,5", confidence=1.01), "--confidence must be in (0, 1]"),
    (dict(prompt="1,5", max_new_tokens=0), "--max_new_tokens must be in 1..1048576"),
    (dict(prompt="1,256"), "token id 256 outside the vocabulary (0..255)"),
    (dict(prompt="1,5", token_ids=False), "No tokenizer"),
    (dict(prompt="1,5", token_ids=False, tokenizer="/nonexistent/tokenizer.json"),
     "No tokenizer at"),
    (dict(prompt="1,5", ckpt="/nonexistent/ckpt"), "No such checkpoint"),
    (dict(prompt="1,5", ckpt=None), "--ckpt is required"),
    (dict(prompt="1,5", prompt_file="/nonexistent/prompts.txt"), "not both"),
    (dict(prompt_file="/nonexistent/prompts.txt"), "Cannot read --prompt_file"),
    (dict(prompt="1,5", top_p=0.0), "top_p"),
    (dict(prompt="1,5", mesh="tensor=2"), "spans 2 devices but 1 are available"),
    (dict(prompt="1,5", mesh="model=2"), "Unknown mesh axis 'model'"),
])
@pytest.mark.slow
def test_bad_input_gives_exit_code_2_and_a_clear_message(ckpt, kwargs, message):
  kwargs = {"ckpt": ckpt, "token_ids": True, **kwargs}
  code, out, err = _run(**kwargs)
  assert code == 2 and out == ""
  assert err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    (["--prompt", ""], "empty"),
    (["--prompt", "1,5", "--confidence", "abc"], "confidence"),
    (["--prompt", "1,999"], "outside the vocabulary"),
    (["--prompt", "1,5", "1,6"], "Give the prompt once"),
])
@pytest.mark.slow
def test_bad_input_in_a_subprocess(ckpt, args, message):
  proc = _decode_py("--ckpt", ckpt, "--token_ids", *args)
  assert proc.returncode == 2, proc.stderr
  assert message in proc.stderr and "Traceback" not in proc.stderr


def test_an_unusable_compilation_cache_is_one_warning_line_and_the_decode_goes_on(ckpt, tmp_path):
  (tmp_path / "file").write_text("")
  bad = str(tmp_path / "file" / "cache")               # under a file: cannot be made
  before = {name: getattr(jax.config, name)
            for name in ("jax_enable_compilation_cache", "jax_compilation_cache_dir")}
  try:
    code, out, err = _run(ckpt=ckpt, token_ids=True, prompt="1,5,7", base=True,
                          max_new_tokens=2, compilation_cache=bad)
  finally:
    for name, value in before.items():
      jax.config.update(name, value)
  assert code == 0, err
  assert len(out.strip().split(",")) == 2
  warnings = [line for line in err.splitlines() if line.startswith("warning:")]
  assert len(warnings) == 1 and bad in warnings[0] and "--compilation_cache" in warnings[0], err

def test_missing_checkpoint_is_named_before_the_tokenizer(tmp_path):
  from hamburger_jax.decode.cli import DecodeArgs, run
  import io
  err = io.StringIO()
  code = run(DecodeArgs(ckpt=str(tmp_path / "nope"), prompt="hi"), io.StringIO(), err)
  assert code == 2 and "No such checkpoint" in err.getvalue()


def test_unset_knobs_take_the_checkpoints_recommendation(ckpt, monkeypatch):
  from hamburger_jax import shipped
  from hamburger_jax.decode.checkpoint import open_checkpoint, resolve_knobs
  from hamburger_jax.serve.cli import parse_args
  knobs = lambda a, d: tuple(resolve_knobs(vars(a), d.knob_defaults).values())
  d = open_checkpoint(ckpt, token_ids=True)
  assert knobs(DecodeArgs(ckpt=ckpt), d) == (0.8, 0.0)              # recommends nothing: 0.8 / 0
  assert knobs(DecodeArgs(ckpt=ckpt, confidence=0.5, min_token_prob=0.2), d) == (0.5, 0.2)
  # A named checkpoint (the tiny one under a name) brings its recommendation and chat template.
  monkeypatch.setitem(shipped.NAMED, "tiny", shipped.NamedCheckpoint(
      name="tiny", asset_dir=ckpt, system="Be brief.", tokenizer_dir=lambda: "tok",
      decode_defaults=lambda: {"confidence": 0.9, "min_token_prob": 0.3},
      load=lambda: load_model(ckpt)[1:]))
  d = open_checkpoint("tiny", token_ids=True)
  assert (*knobs(DecodeArgs(ckpt="tiny"), d), d.chat, d.system) == (0.9, 0.3, True, "Be brief.")
  assert knobs(DecodeArgs(ckpt="tiny", min_token_prob=0.0), d) == (0.9, 0.0)  # a flag given wins
  s = parse_args(["--ckpt", "x", "--min_token_prob", "0.3"])
  assert (s.confidence, s.min_token_prob) == (None, 0.3)


@pytest.mark.slow
def test_a_checkpoints_draft_vocabulary_is_used_unless_full_is_asked(ckpt, tmp_path):
  import shutil
  from hamburger_jax.decode import draft_vocab
  from hamburger_jax.decode.checkpoint import open_checkpoint
  vocab = lambda path, choice=None: open_checkpoint(path, token_ids=True,
                                                    draft_vocab=choice).draft_vocab
  assert vocab(ckpt) is None                                              # it has none
  own = str(tmp_path / "ckpt")
  shutil.copytree(ckpt, own)
  draft_vocab.save(os.path.join(own, draft_vocab.FILE_NAME), [5, 9, 2], source="a test")
  assert vocab(own).tolist() == [5, 9, 2]
  assert vocab(own, "full") is None
  other = str(tmp_path / "other.json")
  draft_vocab.save(other, [7], source="a test")
  assert vocab(own, other).tolist() == [7]
  assert open_checkpoint(own, token_ids=True, base=True).draft_vocab is None   # base: no drafts
  # Decoded with it: every drafted token (after a group's first) is one of its ids.
  code, out, err = _run(ckpt=own, prompt="1,5,7", token_ids=True, json=True, max_new_tokens=16,
                        confidence=0.05)
  assert code == 0, err
  groups = json.loads(out)["outputs"][0]["groups"]
  assert any(len(g) > 1 for g in groups)
  assert all(t in (5, 9, 2) for g in groups for t in g[1:])
  code, out, err = _run(ckpt=own, prompt="1,5", token_ids=True, draft_vocab=str(tmp_path / "no"))
  assert code == 2 and "no draft vocabulary at" in err and err.count("\n") == 1


class _FenceTokenizer:
  def __init__(self, n):
    self.n = n

  def fence_ids(self):
    return list(range(self.n))


def test_code_fence_ids_follow_the_flag_and_the_limit():
  from hamburger_jax.decode.checkpoint import UsageError, code_fence_ids
  assert code_fence_ids(_FenceTokenizer(2), True, base_only=False) == (0, 1)
  assert code_fence_ids(_FenceTokenizer(2), False, False) == ()
  assert code_fence_ids(_FenceTokenizer(2), True, base_only=True) == ()
  assert code_fence_ids(None, True, base_only=False) == ()
  with pytest.raises(UsageError, match="33 code-fence tokens, more than the 32 supported"):
    code_fence_ids(_FenceTokenizer(33), True, base_only=False)
