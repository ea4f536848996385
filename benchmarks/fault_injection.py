r"""Fault injection: training checkpoints (`--target train`, the default) or a running server fed
hostile input (`--target server`).

    python -m benchmarks.fault_injection --trials 25 [--json out.json]
    python -m benchmarks.fault_injection --target server [--scale 0.01] [--ckpt DIR] [--out F]

`--target train` (`hamburger_jax.train.checkpoints.Checkpointer`):

Kinds of trial (cycled, each with its own seed): `flip` (64 bytes of a random file of a random
step inverted), `truncate` (a random file of a random step cut short), `kill` (a saving process
killed with SIGKILL at a random moment), `disk_full` (saving onto a small tmpfs until the disk is
full; skipped with the reason when tmpfs cannot be mounted) and `nan` (a NaN state handed to
save). After each fault the workdir is restored as training does it (`restore_latest_good`).
A trial passes when no finished step is lost (the restored step is at least the newest step that
was completed and left undamaged) and the restored state is finite and bit-identical to what was
saved at that step. Prints JSON and a table and writes the JSON with "provenance" (default
docs/results/data/training/fault_injection.json); exit code 1 if any trial fails.

`--target server`: serve.py is started in a subprocess (a random tiny checkpoint with a word
tokenizer, or --ckpt) and fed the probes of `benchmarks/faults/server_probes.py` one at a time:
huge and over-limit bodies (sizes times --scale), deep nesting, lone surrogates, invalid JSON,
stalled, vanishing and half-closed clients, with ordinary requests as controls. Per probe: the
status, whether an error is an OpenAI error object, the latency of /health polled meanwhile, the
server's RSS before and after; then whether it still answers a completion. Prints a table and
JSON and writes the JSON (default docs/results/data/serving/hostile_input.json); exit code 1 on a
500, an error that is not an error object, an unexpected status, a traceback in the server's log,
or a server that died or stopped answering.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.common import REPO, check_flag_groups, markdown_table, results_dir, write_json

KINDS = ("flip", "truncate", "kill", "disk_full", "nan")
SAVED_STEPS = 5


def make_state(step: int, nan: bool = False) -> dict:
  """A deterministic state of `step` shaped like a small train state (params, optimizer, step)."""
  rng = np.random.default_rng(step)
  w = rng.standard_normal((256, 128)).astype(np.float32)
  if nan:
    w[7, 3] = np.nan
  return {"params": {"w": w, "b": rng.standard_normal((128,)).astype(np.float32)},
          "opt_state": {"mu": rng.standard_normal((256, 128)).astype(np.float32),
                        "count": np.int32(step)},
          "step": np.int32(step)}


def _checkpointer(directory: str, keep: int = 100):
  from hamburger_jax.train import checkpoints  # pylint: disable=g-import-not-at-top
  return checkpoints.Checkpointer(directory, 1, keep)


def save_steps(directory: str, steps, keep: int = 100, report=None) -> None:
  """Saves make_state(step) for each step, waiting for each save; `report(step)` once done."""
  ckpt = _checkpointer(directory, keep)
  for step in steps:
    ckpt.save(step, make_state(step), {"step": step}, {"batches": step}, force=True)
    ckpt.wait()
    if report:
      report(step)
  ckpt.close()


def restore_check(directory: str, newest_intact: int | None) -> dict:
  """Restores like training does; checks the step is not older than `newest_intact` and the
  state is finite and bit-identical to the one saved."""
  import jax  # pylint: disable=g-import-not-at-top
  from hamburger_jax.train import checkpoints, integrity  # pylint: disable=g-import-not-at-top
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype,
                                                         sharding=device), make_state(0))
  ckpt = _checkpointer(directory)
  try:
    found = ckpt.restore_latest_good(abstract)
  except checkpoints.RestoreError as e:
    return {"restored": None, "ok": newest_intact is None, "note": str(e)[:120]}
  finally:
    ckpt.close()
  if found is None:
    return {"restored": None, "ok": newest_intact is None}
  step, state, _ = found
  same = all(np.array_equal(np.asarray(a), b) for a, b in
             zip(jax.tree.leaves(state), jax.tree.leaves(make_state(step))))
  finite = integrity.inspect(state).finite
  return {"restored": step, "finite": finite, "identical": same,
          "ok": finite and same and step >= (newest_intact or 0)}


def _files(directory: str, step: int) -> list[str]:
  root = os.path.join(directory, str(step))
  return sorted(os.path.join(r, f) for r, _, fs in os.walk(root) for f in fs
                if os.path.getsize(os.path.join(r, f)) > 0)


def _damage(rng, directory: str, kind: str) -> tuple[int, str]:
  """Flips or truncates one random file of one random saved step -> (step, file)."""
  step = int(rng.integers(1, SAVED_STEPS + 1))
  files = _files(directory, step)
  arrays = [f for f in files if f"{os.sep}state{os.sep}" in f]
  path = str(rng.choice(arrays if rng.random() < 0.75 else files))   # mostly the stored arrays
  with open(path, "r+b") as f:
    data = bytearray(f.read())
    if kind == "flip":
      at = int(rng.integers(0, max(1, len(data) - 64)))
      data[at:at + 64] = bytes(b ^ 0xFF for b in data[at:at + 64])
      f.seek(0)
      f.write(bytes(data))
    else:
      f.truncate(int(rng.integers(0, len(data))))
  return step, os.path.relpath(path, directory)


def trial_damage(rng, base: str, work: str, kind: str) -> dict:
  directory = os.path.join(work, "ckpt")
  shutil.copytree(base, directory)
  step, path = _damage(rng, directory, kind)
  newest_intact = SAVED_STEPS if step != SAVED_STEPS else SAVED_STEPS - 1
  return {"damaged": f"{path}", **restore_check(directory, newest_intact)}


def _child(directory: str, keep: int):
  """The saving process of `kill` and `disk_full` trials: prints each completed step."""
  save_steps(directory, range(1, 10_000), keep, report=lambda s: print(s, flush=True))


def _spawn(directory: str, keep: int) -> subprocess.Popen:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
  return subprocess.Popen([sys.executable, "-m", __spec__.name, "--child", directory,
                           "--keep", str(keep)], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, env=env)


def trial_kill(rng, work: str) -> dict:
  directory = os.path.join(work, "ckpt")
  proc = _spawn(directory, keep=3)
  done = [int(proc.stdout.readline())]                  # the first save completed
  deadline = time.time() + float(rng.uniform(0.05, 2.0))
  os.set_blocking(proc.stdout.fileno(), False)
  while time.time() < deadline:
    time.sleep(0.01)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  os.set_blocking(proc.stdout.fileno(), True)
  done += [int(line) for line in proc.stdout.read().split()]
  return {"completed": done[-1], **restore_check(directory, done[-1])}


def mount_tmpfs(path: str, size: str) -> str | None:
  """Mounts a tmpfs of `size` at `path` -> None, or why it could not."""
  os.makedirs(path, exist_ok=True)
  out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                       capture_output=True, text=True, check=False)
  return None if out.returncode == 0 else (out.stderr.strip() or "mount failed")


def trial_disk_full(rng, work: str) -> dict:
  mnt = os.path.join(work, "tmpfs")
  why = mount_tmpfs(mnt, f"{int(rng.integers(1200, 2400))}k")
  if why:
    return {"skipped": f"cannot mount tmpfs: {why}", "ok": True}
  try:
    proc = _spawn(os.path.join(mnt, "ckpt"), keep=1000)
    try:
      out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
      proc.kill()
      return {"ok": False, "note": "the saver hung on the full disk"}
    done = [int(s) for s in out.split()]
    return {"completed": done[-1] if done else None, "saver_exit": proc.returncode,
            **restore_check(os.path.join(mnt, "ckpt"), done[-1] if done else None)}
  finally:
    subprocess.run(["umount", mnt], check=False)


def trial_nan(rng, base: str, work: str) -> dict:
  from hamburger_jax.train import checkpoints  # pylint: disable=g-import-not-at-top
  directory = os.path.join(work, "ckpt")
  shutil.copytree(base, directory)
  ckpt = _checkpointer(directory, keep=1)              # keep=1: a bad save must delete nothing
  step = SAVED_STEPS + 1 + int(rng.integers(0, 3))
  try:
    ckpt.save(step, make_state(step, nan=True), {}, {}, force=True)
    refused = False
  except checkpoints.NonFiniteStateError:
    refused = True
  ckpt.manager.wait_until_finished()
  result = restore_check(directory, SAVED_STEPS)
  return {**result, "refused": refused, "ok": refused and result["ok"]}


def run_trials(n: int, seed: int = 0, kinds=KINDS) -> list[dict]:
  """`n` trials cycling through `kinds`; each dict has kind, seed, ok and the details."""
  out = []
  with tempfile.TemporaryDirectory() as tmp:
    base = os.path.join(tmp, "base")
    save_steps(base, range(1, SAVED_STEPS + 1))
    for i in range(n):
      kind = kinds[i % len(kinds)]
      rng = np.random.default_rng((seed, i))
      work = tempfile.mkdtemp(dir=tmp)
      t0 = time.time()
      if kind in ("flip", "truncate"):
        result = trial_damage(rng, base, work, kind)
      elif kind == "kill":
        result = trial_kill(rng, work)
      elif kind == "disk_full":
        result = trial_disk_full(rng, work)
      else:
        result = trial_nan(rng, base, work)
      out.append({"trial": i, "kind": kind, "seconds": round(time.time() - t0, 2), **result})
  return out


def _train_main(a, argv) -> int:
  trials = run_trials(a.trials, a.seed)
  summary = {"trials": len(trials), "failed": sum(not t["ok"] for t in trials),
             "skipped": sum("skipped" in t for t in trials), "results": trials}
  write_json(summary, a.json, __spec__.name, argv)
  print(json.dumps({k: v for k, v in summary.items() if k != "results"}))
  print(markdown_table(
      ["trial", "kind", "restored", "newest finished", "ok", "s", "note"],
      [[t["trial"], t["kind"], t.get("restored"), t.get("completed", "-"), t["ok"], t["seconds"],
        t.get("skipped") or t.get("damaged", "")] for t in trials]))
  return 1 if summary["failed"] else 0


def _server_main(a, argv) -> int:
  from benchmarks.faults import server_probes  # pylint: disable=g-import-not-at-top
  from hamburger_jax.serve import app, http  # pylint: disable=g-import-not-at-top
  for name, default in (("max_body_bytes", app.MAX_BODY_BYTES),
                        ("header_timeout", http.HEADER_TIMEOUT_S),
                        ("body_timeout", http.BODY_TIMEOUT_S)):     # serve.py's own defaults
    if getattr(a, name) is None:
      setattr(a, name, default)
  flags = ["--engine", a.engine, "--cache_length", str(a.cache_length), "--max_body_bytes",
           str(a.max_body_bytes), "--header_timeout", str(a.header_timeout), "--body_timeout",
           str(a.body_timeout), "--log_level", "info"]
  result = server_probes.run(a.ckpt, flags, a.scale, a.max_body_bytes,
                             timeout=a.header_timeout + a.body_timeout + 60)
  result["settings"] = {"scale": a.scale, "serve_flags": flags}
  write_json(result, a.json, __spec__.name, argv)
  print(markdown_table(server_probes.TABLE_HEADER, server_probes.table(result["rows"])))
  print(json.dumps(result))
  return 0 if result["summary"]["passed"] else 1


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--target", choices=("train", "server"), default="train",
                 help="training checkpoints, or serve.py fed hostile input")
  p.add_argument("--json", "--out", dest="json", default=None,
                 help="the JSON ('' = print only; default: training/fault_injection.json or "
                      "serving/hostile_input.json under docs/results/data)")
  train = p.add_argument_group("--target train")
  train.add_argument("--trials", type=int, default=25)
  train.add_argument("--seed", type=int, default=0)
  server = p.add_argument_group("--target server")
  server.add_argument("--ckpt", default=None, help="any serve.py checkpoint (default: tiny random)")
  server.add_argument("--scale", type=float, default=1.0,
                      help="size of the large probes (1.0: 1,000,000 messages, 10 MB texts)")
  server.add_argument("--engine", default="continuous", help="serve.py --engine")
  server.add_argument("--cache_length", type=int, default=128, help="serve.py --cache_length")
  server.add_argument("--max_body_bytes", type=int, default=None,
                      help="serve.py --max_body_bytes (default: its own; one probe sends one "
                           "byte more)")
  server.add_argument("--header_timeout", type=float, default=None,
                      help="serve.py --header_timeout (default: its own)")
  server.add_argument("--body_timeout", type=float, default=None,
                      help="serve.py --body_timeout (default: its own)")
  p.add_argument("--child", default=None, help=argparse.SUPPRESS)
  p.add_argument("--keep", type=int, default=3, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.child:
    _child(a.child, a.keep)
    return 0
  check_flag_groups(p, a, {
      "train": {"trials": 25, "seed": 0},
      "server": {"ckpt": None, "scale": 1.0, "engine": "continuous", "cache_length": 128,
                 "max_body_bytes": None, "header_timeout": None, "body_timeout": None}},
      a.target)
  if not a.scale > 0:
    p.error(f"--scale must be > 0, got {a.scale}.")
  if a.json is None:
    a.json = (os.path.join(results_dir("training"), "fault_injection.json") if a.target == "train"
              else os.path.join(results_dir("serving"), "hostile_input.json"))
  return _train_main(a, argv) if a.target == "train" else _server_main(a, argv)


if __name__ == "__main__":
  sys.exit(main())
