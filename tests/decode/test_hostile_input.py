"""decode.py under hostile input: prompt text read with a byte and a line cap (/dev/zero fails
fast with bounded memory), prompt files decoded in chunks of --batch_size, contradictory or
ignored flags refused, strict token-id lists, --system checked as UTF-8, and EOS ids outside the
vocabulary refused when the checkpoint is opened. Each refusal: exit code 2 and one line."""

import io
import json
import os
import subprocess
import sys
import time
import types

import pytest

from hamburger_jax.convert import CheckpointError
from hamburger_jax.decode import cli
from hamburger_jax.decode.checkpoint import open_checkpoint
from hamburger_jax.decode.chunks import decode_chunks, merge_results
from hamburger_jax.decode.cli import DecodeArgs, UsageError, run
from hamburger_jax.decode.prompts import MAX_PROMPT_BYTES, parse_token_ids
from hamburger_jax.decode.state import DecodeResult
from hamburger_jax.testing.fixtures import make_tiny_checkpoint
from tests.fixture_paths import OFFICIAL_TINY, REPO


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  return make_tiny_checkpoint(str(tmp_path_factory.mktemp("hostile") / "tiny"))


@pytest.fixture
def unread(tmp_path):
  """A checkpoint path that is never opened (the input is refused first)."""
  return str(tmp_path)


def _run(stdin=None, **kwargs):
  out, err = io.StringIO(), io.StringIO()
  code = run(DecodeArgs(**kwargs), stdout=out, stderr=err, stdin=stdin or io.StringIO(""))
  return code, out.getvalue(), err.getvalue()


def _refused(code, out, err, *needles):
  assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1, err
  for needle in needles:
    assert needle in err, err


# --- bounded reads -----------------------------------------------------------------------------

def _peak_rss_mib(pid: int, last: float) -> float:
  """VmHWM of a running process (its own peak since exec; 'last' once it has gone)."""
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 1024
  except OSError:
    pass
  return last


def _decode_py_on_dev_zero(ckpt, args, as_stdin):
  """-> (exit code, stderr, peak RSS in MiB) of decode.py reading /dev/zero (killed after 120 s).

  The peak is polled from /proc (VmHWM): a child's getrusage maxrss would include the memory of
  the forked test process it started as."""
  with open("/dev/zero", "rb") as zero:
    proc = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "decode.py"), "--ckpt", ckpt, *args], cwd=REPO,
        env=dict(os.environ, JAX_PLATFORMS="cpu"), stdin=zero if as_stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline, peak = time.monotonic() + 120, 0.0
    while True:
      peak = max(peak, _peak_rss_mib(proc.pid, peak))
      pid, status = os.waitpid(proc.pid, os.WNOHANG)
      if pid:
        break
      if time.monotonic() > deadline:
        proc.kill()
      time.sleep(0.01)
  proc.returncode = os.waitstatus_to_exitcode(status)
  with proc.stdout, proc.stderr:
    assert proc.stdout.read() == b""
    return proc.returncode, proc.stderr.read().decode(), peak


def test_dev_zero_fails_fast_in_process(unread):
  t0 = time.perf_counter()
  code, out, err = _run(ckpt=unread, prompt_file="/dev/zero")
  assert time.perf_counter() - t0 < 30      # the endless input is never read to its end
  _refused(code, out, err, f"more than {MAX_PROMPT_BYTES} bytes", "--max_prompt_bytes")


@pytest.mark.parametrize("args, as_stdin", [(["--prompt_file", "/dev/zero"], False), ([], True)])
def test_dev_zero_exits_2_with_bounded_memory(unread, args, as_stdin):
  # Without the cap the whole endless input was read: gigabytes, then killed with no message.
  code, err, peak_mib = _decode_py_on_dev_zero(unread, args, as_stdin)
  assert code == 2 and err.count("\n") == 1 and "--max_prompt_bytes" in err, err
  assert peak_mib < 1024, f"peak RSS {peak_mib:.0f} MiB"


def test_stdin_and_prompt_over_the_byte_cap(unread):
  stdin = io.TextIOWrapper(io.BytesIO(b"1,2\n" * 100))
  code, out, err = _run(ckpt=unread, token_ids=True, stdin=stdin, max_prompt_bytes=64)
  _refused(code, out, err, "The text on stdin holds more than 64 bytes", "--max_prompt_bytes")
  code, out, err = _run(ckpt=unread, token_ids=True, stdin=io.StringIO("1,2\n" * 100),
                        max_prompt_bytes=64)                        # a text stream: the same
  _refused(code, out, err, "more than 64 bytes")
  code, out, err = _run(ckpt=unread, token_ids=True, prompt="1," * 40, max_prompt_bytes=64)
  _refused(code, out, err, "The prompt holds more than 64 bytes")


def test_prompt_lines_over_the_line_cap(tmp_path):
  path = tmp_path / "many.txt"
  path.write_text("1,2\n\n" * 5)                                   # blank lines do not count
  code, out, err = _run(ckpt=str(tmp_path), token_ids=True, prompt_file=str(path), max_prompts=3)
  _refused(code, out, err, "holds 5 prompts, more than the --max_prompts cap of 3")


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=0), "--batch_size must be in 1..4096, got 0"),
    (dict(max_prompt_bytes=0), "--max_prompt_bytes must be in 1.."),
    (dict(max_prompt_bytes=10**30), "--max_prompt_bytes must be in 1.."),
    (dict(max_prompts=-1), "--max_prompts must be in 1.."),
])
def test_cap_flags_are_range_checked(unread, kwargs, message):
  _refused(*_run(ckpt=unread, token_ids=True, prompt="1", **kwargs), message)


# --- chunks ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_prompt_file_decodes_in_chunks_printed_in_order(ckpt, tmp_path, monkeypatch):
  rows = []
  monkeypatch.setattr(cli, "check_buffer_memory",
                      lambda llama, n, length, available=None, kv_dtype="model": rows.append(n))
  path = tmp_path / "prompts.txt"
  path.write_text("1,5,7\n1,9\n\n3,4\n")
  code, out, err = _run(ckpt=ckpt, token_ids=True, prompt_file=str(path), batch_size=2,
                        max_new_tokens=4)
  assert code == 0, err
  assert rows == [2]                          # the memory estimate is one chunk's, not the file's
  lines = out.splitlines()
  assert lines[0::2] == ["### 0", "### 1", "### 2"]
  assert all(len(line.split(",")) == 4 for line in lines[1::2])
  assert "12 new tokens" in err


class _FakeSampler:
  """Decodes each prompt to [its first id] and records the chunks it was given."""

  def __init__(self):
    self.calls = []

  def prompt_bucket(self, chunk):
    return 16

  def decode(self, chunk, **knobs):
    self.calls.append((len(chunk), knobs.get("confidence")))
    n = len(chunk)
    return DecodeResult(tokens=[[p[0]] for p in chunk], group_sizes=[[1]] * n,
                        logprobs=[[0.0]] * n, logits=[[0.0]] * n, stop_logits=[[0.0]] * n,
                        finish_reasons=["length"] * n, macro_steps=[1] * n,
                        prompt_lengths=[len(p) for p in chunk], iterations=1, decode_s=1.0)


def test_decode_chunks_hands_on_each_chunk_and_merges_in_order():
  sampler, base = _FakeSampler(), _FakeSampler()
  seen = []
  prompts = [[i, 1] for i in range(7)]
  result, base_result = decode_chunks(sampler, prompts, {"confidence": 0.5}, 3, base,
                                      lambda start, r, b: seen.append((start, r.tokens, b.tokens)))
  assert [s for s, _, _ in seen] == [0, 3, 6]
  assert seen[1][1] == seen[1][2] == [[3], [4], [5]]
  assert result.tokens == base_result.tokens == [[i] for i in range(7)]
  assert result.iterations == 3 and result.decode_s == 3.0 and result.stats()["rows"] == 7
  # A new bucket (3 rows, then 1) is decoded once untimed first; the base with confidence 1.
  assert sampler.calls == [(3, 0.5), (3, 0.5), (3, 0.5), (1, 0.5), (1, 0.5)]
  assert base.calls == [(3, 1.0), (3, 1.0), (3, 1.0), (1, 1.0), (1, 1.0)]
  assert decode_chunks(sampler, prompts, {}, 32)[1] is None


def test_merge_results_sums_draft_counts():
  a = DecodeResult([[1]], [[1]], [[0.0]], [[0.0]], [[0.0]], ["eos"], [1], [2], 2,
                   draft_counts=[[2, 1], [1, 0]])
  b = DecodeResult([[5, 6]], [[2]], [[0.0] * 2], [[0.0] * 2], [[0.0] * 2], ["length"], [1], [3],
                   4, draft_counts=[[3, 0], [2, 2]])
  m = merge_results([a, b])
  assert m.draft_counts == [[5, 1], [3, 2]] and m.tokens == [[1], [5, 6]] and m.iterations == 6
  assert merge_results([a]) is a


# --- contradictory or ignored flags ------------------------------------------------------------

@pytest.mark.parametrize("kwargs, flags", [
    (dict(base=True, compare_base=True), ("--base", "--compare_base")),
    (dict(base=True, verify=True), ("--base", "--verify")),
    (dict(verify_steps=6), ("--verify_steps", "--verify")),
    (dict(verify=True, verify_steps=1), ("--verify_steps", "2..16")),
    (dict(draft_branches=2), ("--draft_branches", "--verify")),
    (dict(verify=True, draft_branches=9), ("--draft_branches", "1..8")),
    (dict(lookup_drafts=3), ("--lookup_drafts", "--verify")),
    (dict(verify=True, lookup_drafts=9), ("--lookup_drafts", "0..8")),
    (dict(verify=True, draft_branches=2, lookup_drafts=3), ("--lookup_drafts", "--draft_branches")),
    (dict(token_ids=True, chat=True), ("--token_ids", "--chat")),
    (dict(system="Be brief."), ("--system", "--chat")),
    (dict(token_ids=True, system="Be brief."), ("--system", "--token_ids")),
    (dict(base=True, confidence=0.5), ("--confidence", "--base")),
    (dict(base=True, min_token_prob=0.2), ("--min_token_prob", "--base")),
    (dict(base=True, max_group=2), ("--max_group", "--base")),
    (dict(base=True, draft_vocab="full"), ("--draft_vocab", "--base")),
])
def test_contradictory_flags_are_refused_before_loading(tmp_path, kwargs, flags):
  missing = str(tmp_path / "not_read")                     # refused before the checkpoint
  code, out, err = _run(ckpt=missing, prompt="1", **kwargs)
  _refused(code, out, err, *flags)


def test_system_is_used_where_chat_is_on_or_implied():
  cli.check_flag_pairs(DecodeArgs(ckpt="/x", chat=True, system="Be brief."))
  cli.check_flag_pairs(DecodeArgs(ckpt="smollm2", system="Be brief."))   # a chat model by name
  with pytest.raises(UsageError, match="--system"):
    cli.check_flag_pairs(DecodeArgs(ckpt="smollm2", token_ids=True, system="Be brief."))


@pytest.mark.parametrize("kwargs, flag", [
    (dict(compare_base=True), "--compare_base"), (dict(verify=True), "--verify"),
    (dict(confidence=0.5), "--confidence"), (dict(max_group=2), "--max_group"),
])
def test_hamburger_flags_on_a_plain_llama_checkpoint_are_refused(kwargs, flag):
  plain = types.SimpleNamespace(base_only=True)
  with pytest.raises(UsageError, match=f"{flag} needs a HAMburger checkpoint; /llama is a plain"):
    cli.check_plain_checkpoint(DecodeArgs(ckpt="/llama", **kwargs), plain)
  cli.check_plain_checkpoint(DecodeArgs(ckpt="/llama", base=True), plain)
  cli.check_plain_checkpoint(DecodeArgs(ckpt="/ham", **kwargs),
                             types.SimpleNamespace(base_only=False))


# --- token ids and text ------------------------------------------------------------------------

@pytest.mark.parametrize("line, message", [
    ("1,,2", "element 1 is empty in '1,,2'"),
    ("1,5,", "element 2 is empty"),
    (",1", "element 0 is empty"),
    ("1 5,7", "element 0 is '1 5'"),
    ("1,5.0", "element 1 is '5.0'"),
    ("+5", "element 0 is '+5'"),
    ("1,\u0663", "element 1 is '\u0663'"),                        # a non-ASCII digit
    ("1,-3", "Prompt 4 element 1 is -3: token ids are >= 0"),
    ("9" * 5000, "has 5000 digits: it lies outside the vocabulary"),
])
def test_token_id_lists_are_parsed_strictly(line, message):
  with pytest.raises(UsageError, match="Prompt 4") as e:
    parse_token_ids(line, 4)
  assert message in str(e.value)


def test_token_ids_may_be_spaced():
  assert parse_token_ids(" 1, 5 ,7 ", 0) == [1, 5, 7]


def test_empty_item_is_refused_before_loading(unread):
  _refused(*_run(ckpt=unread, token_ids=True, prompt="1,,2"), "element 1 is empty")


def test_invalid_utf8_in_system_is_one_clean_line(tmp_path):
  system = b"caf\xe9".decode("utf-8", "surrogateescape")           # how argv carries the bytes
  code, out, err = _run(ckpt=str(tmp_path), prompt="hi", chat=True, system=system)
  _refused(code, out, err, "--system is not valid UTF-8 (byte e9 at character 3)")


# --- EOS ids -----------------------------------------------------------------------------------

def test_eos_outside_the_vocabulary_is_refused_on_open(tmp_path):
  cfg = json.loads(open(os.path.join(OFFICIAL_TINY, "config.json")).read())
  cfg["eos_token_id"] = [2, 9999]
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  weights = os.path.join(OFFICIAL_TINY, "tiny_official.safetensors")
  config = str(tmp_path / "config.json")
  with pytest.raises(CheckpointError, match=r"eos_token_ids holds 9999, outside the vocabulary "
                                            r"of 256 tokens"):
    open_checkpoint(weights, base_config=config, token_ids=True)
  _refused(*_run(ckpt=weights, base_config=config, token_ids=True, prompt="1,5"), "9999",
           "256 tokens")
