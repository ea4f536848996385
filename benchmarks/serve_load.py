"""Serving under load: many greedy requests, a fixed number in flight, through the OpenAI API.

    python -m benchmarks.serve_load                       # tiny random weights, both engines
    python -m benchmarks.serve_load --requests 200 --concurrency 16 --engines serial,continuous
    python -m benchmarks.serve_load --ckpt smollm2 --max_tokens 128

For each engine, serve.py runs in a subprocess on 127.0.0.1 (token-id prompts, /v1/completions)
and is warmed up with a few requests; then --requests requests (random prompts and max_tokens
from a fixed seed) are sent by the `openai` client, --concurrency at a time. Checks: every
response arrives, and its tokens equal the same request decoded alone (`Sampler.decode`, greedy,
same KV buffer). Reports p50 / p99 latency, output tokens/s over the whole run, the ratio of
each engine's throughput to the serial engine's (one request at a time), and the share of the
run the server's engine thread spent inside `engine.step()` (the rest: HTTP, queueing, idling). Writes
<out_dir>/serve_load.json (default docs/results/data/serving/), with "provenance". Random weights (no --ckpt) say nothing about a trained model's
group lengths.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

# This process (the reference decodes) and the server subprocess share one accelerator: neither
# may take the default 75% of its memory up front (set before JAX starts; inherited by the server).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from benchmarks.common import REPO, machine, markdown_table, results_dir, write_json  # noqa: E402
from hamburger_jax.decode.checkpoint import open_checkpoint, resolve_knobs  # noqa: E402
from hamburger_jax.decode.sampler import Sampler  # noqa: E402
from hamburger_jax.model.config import HamburgerConfig  # noqa: E402


# --- the load (also used by tests/serve/test_load.py) ---------------------------------------------

def make_workload(n: int, seed: int, vocab: int, prompt_lens=(2, 16), max_tokens=(8, 48)):
  """n (prompt ids, max_tokens) pairs drawn from `seed` (ids 3.. to keep BOS/EOS out)."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    length = int(rng.integers(prompt_lens[0], prompt_lens[1] + 1))
    out.append((rng.integers(3, vocab, length).tolist(),
                int(rng.integers(max_tokens[0], max_tokens[1] + 1))))
  return out


async def _one(client, model, prompt, max_tokens, knobs, sem, i):
  async with sem:
    t0 = time.perf_counter()
    out = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                          temperature=0, extra_body=knobs)
    choice = out.choices[0]
    return {"index": i, "latency_s": time.perf_counter() - t0,
            "token_ids": choice.model_extra["token_ids"], "finish_reason": choice.finish_reason,
            "macro_steps": out.usage.model_extra["hamburger"]["macro_steps"]}


async def run_load(base_url: str, model: str, workload, concurrency: int,
                   knobs: dict | None = None) -> tuple[list[dict | BaseException], float]:
  """Sends every request (at most `concurrency` in flight) -> (results by index, wall seconds).
  knobs: HAMburger's request fields ({"confidence", "min_token_prob"}; default confidence 0.8).
  A request that failed is its exception."""
  knobs = {"confidence": 0.8} if knobs is None else knobs
  import openai  # pylint: disable=g-import-not-at-top
  sem = asyncio.Semaphore(concurrency)
  async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0,
                                timeout=3600) as client:
    t0 = time.perf_counter()
    results = await asyncio.gather(
        *[_one(client, model, p, m, knobs, sem, i) for i, (p, m) in enumerate(workload)],
        return_exceptions=True)
    return list(results), time.perf_counter() - t0


def reference_tokens(cfg, params, workload, cache_length: int, confidence: float,
                     base: bool = False, min_token_prob: float = 0.0) -> list[list[int]]:
  """Each request decoded alone with the sampler (greedy, the model's EOS ids)."""
  llama = cfg.base if isinstance(cfg, HamburgerConfig) else cfg
  sampler = Sampler(cfg, params, base=base, cache_length=cache_length, out_length=cache_length,
                    eos_ids=llama.eos_token_ids)
  return [sampler.decode([p], max_new_tokens=m, confidence=confidence,
                         min_token_prob=min_token_prob, temperature=0.0).tokens[0]
          for p, m in workload]


def summarize(results, wall_s: float, references) -> dict:
  """Latency percentiles, throughput, and the checks against decoding alone."""
  ok = [r for r in results if isinstance(r, dict)]
  lat = np.array([r["latency_s"] for r in ok]) if ok else np.zeros(1)
  tokens = sum(len(r["token_ids"]) for r in ok)
  mismatched = [r["index"] for r in ok if r["token_ids"] != references[r["index"]]]
  return {"requests": len(results), "answered": len(ok),
          "failed": [repr(r) for r in results if not isinstance(r, dict)][:5],
          "mismatched": mismatched, "identical_to_alone": not mismatched and len(ok) == len(results),
          "latency_p50_s": float(np.percentile(lat, 50)),
          "latency_p99_s": float(np.percentile(lat, 99)), "wall_s": wall_s,
          "output_tokens": tokens, "tokens_per_s": tokens / wall_s,
          "requests_per_s": len(ok) / wall_s,
          "tokens_per_macro_step": tokens / max(sum(r["macro_steps"] for r in ok), 1)}


# --- the benchmark: serve.py subprocesses -----------------------------------------------------------

def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start_server(args, engine: str, port: int) -> subprocess.Popen:
  cmd = [sys.executable, os.path.join(REPO, "serve.py"), "--ckpt", args.ckpt, "--token_ids",
         "--engine", engine, "--port", str(port), "--cache_length", str(args.cache_length),
         "--chunk_steps", str(args.chunk_steps), "--num_slots", str(args.num_slots),
         "--max_queue", str(args.requests), "--model_id", "bench", "--log_level", "warning"]
  if engine == "continuous":        # the serial baseline keeps the sampler's defaults
    cmd += ["--micro_policy", args.micro_policy]
    if args.compact_micro_steps is not None:
      cmd.append("--compact_micro_steps" if args.compact_micro_steps else "--no-compact_micro_steps")
  return subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True)


def wait_healthy(proc, url: str, seconds: float = 900) -> None:
  """Polls GET /health until 200 (RuntimeError if `proc` exits or time runs out)."""
  import httpx2  # pylint: disable=g-import-not-at-top
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"serve.py exited: {proc.stderr.read()}")
    try:
      if httpx2.get(url + "/health", timeout=2).status_code == 200:
        return
    except httpx2.TransportError:
      pass
    time.sleep(0.5)
  raise RuntimeError("serve.py did not start in time")


def bench_engine(args, engine: str, workload, references) -> dict:
  """One engine: start serve.py, warm up, run the load, stop it with SIGTERM."""
  port = free_port()
  url = f"http://127.0.0.1:{port}"
  proc = _start_server(args, engine, port)
  try:
    wait_healthy(proc, url)
    warm = workload[:args.num_slots]                    # compiles every bucket the load uses
    knobs = {"confidence": args.confidence, "min_token_prob": args.min_token_prob}
    asyncio.run(run_load(url, "bench", warm, args.concurrency, knobs))
    before = _engine_stats(url)
    results, wall = asyncio.run(run_load(url, "bench", workload, args.concurrency, knobs))
    after = _engine_stats(url)
  finally:
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(120)
  out = summarize(results, wall, references)
  busy = after["step_s"] - before["step_s"]
  out.update(engine=engine, exit_code=code, engine_steps=after["steps"] - before["steps"],
             engine_busy_s=busy, engine_busy_share=busy / wall)
  return out


def _engine_stats(url: str) -> dict:
  """The server's engine counters (GET /health): steps run and seconds spent in them."""
  import httpx2  # pylint: disable=g-import-not-at-top
  return httpx2.get(url + "/health", timeout=10).json()


def _load_model(args):
  """-> (cfg, params, base_only, {confidence, min_token_prob}: the given knobs, else the
  checkpoint's recommended ones)."""
  d = open_checkpoint(args.ckpt, token_ids=True, draft_vocab="full")
  knobs = resolve_knobs({"confidence": args.confidence, "min_token_prob": args.min_token_prob},
                        d.knob_defaults)
  return d.config, d.params, d.base_only, knobs


def _table(rows) -> str:
  header = ["engine", "answered", "identical", "p50 s", "p99 s", "tokens/s", "x serial",
            "engine busy"]
  return markdown_table(header, [
      [r["engine"], f"{r['answered']}/{r['requests']}", r["identical_to_alone"],
       f"{r['latency_p50_s']:.3f}", f"{r['latency_p99_s']:.3f}", f"{r['tokens_per_s']:.1f}",
       f"{r.get('throughput_vs_serial', float('nan')):.2f}",
       f"{r['engine_busy_share']:.0%}"] for r in rows])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--ckpt", default=None, help="any decode.py checkpoint (default: tiny random)")
  p.add_argument("--engines", default="serial,continuous")
  p.add_argument("--requests", type=int, default=200)
  p.add_argument("--concurrency", type=int, default=16)
  p.add_argument("--num_slots", type=int, default=16)
  p.add_argument("--cache_length", type=int, default=128)
  p.add_argument("--chunk_steps", type=int, default=8)
  p.add_argument("--max_tokens", type=int, default=64, help="largest max_tokens of a request")
  p.add_argument("--confidence", type=float, default=None,
                 help="default: the checkpoint's recommended knob (manifest), else 0.8")
  p.add_argument("--min_token_prob", type=float, default=None,
                 help="default: the checkpoint's recommended knob (manifest), else 0")
  p.add_argument("--micro_policy", default="all",
                 help="continuous engine's micro-step policy ('all': answers equal decoding alone)")
  p.add_argument("--compact_micro_steps", type=int, default=None,
                 help="1 / 0: the continuous engine runs micro steps on the continuing rows only / "
                      "on every row (default: the server's, off)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out_dir", default=results_dir("serving"))
  args = p.parse_args(argv)
  if args.ckpt is None:
    from hamburger_jax.testing.fixtures import make_tiny_checkpoint  # pylint: disable=g-import-not-at-top
    args.ckpt = make_tiny_checkpoint(os.path.join(tempfile.mkdtemp(), "tiny_ckpt"), args.seed)
  cfg, params, base_only, knobs = _load_model(args)
  vars(args).update(knobs)
  vocab = (cfg.base if isinstance(cfg, HamburgerConfig) else cfg).vocab_size
  workload = make_workload(args.requests, args.seed, vocab,
                           max_tokens=(max(1, args.max_tokens // 4), args.max_tokens))
  refs = reference_tokens(cfg, params, workload, args.cache_length, args.confidence, base_only,
                          args.min_token_prob)
  rows = [bench_engine(args, e, workload, refs) for e in args.engines.split(",")]
  serial = next((r for r in rows if r["engine"] == "serial"), None)
  for r in rows:
    if serial is not None:
      r["throughput_vs_serial"] = r["tokens_per_s"] / serial["tokens_per_s"]
  import jax  # pylint: disable=g-import-not-at-top
  result = {"machine": f"{machine()}; device "
                       f"{jax.devices()[0].device_kind}", "ckpt": args.ckpt,
            "settings": {k: v for k, v in vars(args).items() if k != "out_dir"}, "engines": rows}
  write_json(result, os.path.join(args.out_dir, "serve_load.json"), __spec__.name, argv)
  print(_table(rows))
  print(json.dumps(result))
  return 0 if all(r["identical_to_alone"] for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
