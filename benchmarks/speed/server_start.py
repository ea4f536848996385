r"""How soon the server answers: seconds until /health answers 200, then each chat request's
latency, per --warmup_prompt_tokens setting, with XLA's persistent compilation cache off.

    python -m benchmarks.speed.server_start                        # settings 1 and 128, shipped model
    python -m benchmarks.speed.server_start --settings 1,128 --repeats 2

Each run is a fresh `serve.py` process on 127.0.0.1; the chat requests (greedy, 32 tokens at
most) go one after another, in the order of MESSAGES, so each shows whether its prompt's
prefill bucket was compiled by the warm-up or by the request. Writes serving/server_start.json unless
--out says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

from benchmarks.common import (REPO, markdown_table, positive_int, positive_ints, results_dir,
                               write_json)
from benchmarks.serve_load import free_port, wait_healthy
from hamburger_jax.serve.cli import default_model_id

MESSAGES = ("Hi", "What is the capital of France?",
            "Write a short poem about the sea, with four lines that rhyme, and explain its meter. "
            * 3, "Hi")


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--ckpt", default="smollm2")
  parser.add_argument("--settings", type=positive_ints, default=[1, 128],
                      help="--warmup_prompt_tokens values, each its own server (1: a one-token "
                           "warm-up, the smallest prefill bucket only)")
  parser.add_argument("--repeats", type=positive_int, default=1,
                      help="servers per setting, in rotation")
  parser.add_argument("--max_tokens", type=positive_int, default=32)
  parser.add_argument("--out", default=os.path.join(results_dir("serving"), "server_start.json"),
                      help="the JSON's path ('' = print only)")
  return parser


def _post(url: str, body: dict) -> dict:
  request = urllib.request.Request(url, json.dumps(body).encode(),
                                   {"Content-Type": "application/json"})
  with urllib.request.urlopen(request, timeout=600) as r:
    return json.load(r)


def run_server(ckpt: str, warmup_prompt_tokens: int, max_tokens: int) -> dict:
  """One serve.py process: seconds to /health, then each message's tokens and seconds."""
  port = free_port()
  url = f"http://127.0.0.1:{port}"
  start = time.perf_counter()
  server = subprocess.Popen(
      [sys.executable, os.path.join(REPO, "serve.py"), "--ckpt", ckpt, "--port", str(port),
       "--compilation_cache", "", "--warmup_prompt_tokens", str(warmup_prompt_tokens),
       "--log_level", "warning"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
      text=True)
  try:
    wait_healthy(server, url)
    health_s = time.perf_counter() - start
    requests = []
    for message in MESSAGES:
      t = time.perf_counter()
      out = _post(url + "/v1/chat/completions", {
          "model": default_model_id(ckpt), "temperature": 0,
          "max_tokens": max_tokens, "messages": [{"role": "user", "content": message}]})
      requests.append({"prompt_tokens": out["usage"]["prompt_tokens"],
                       "completion_tokens": out["usage"]["completion_tokens"],
                       "seconds": round(time.perf_counter() - t, 2)})
  finally:
    server.terminate()
    server.wait(timeout=120)
  return {"health_s": round(health_s, 2), "requests": requests}


def main(argv: list[str] | None = None) -> dict:
  args = build_parser().parse_args(argv)
  runs = {s: [] for s in args.settings}
  for _ in range(args.repeats):
    for s in args.settings:
      runs[s].append(run_server(args.ckpt, s, args.max_tokens))
      print(json.dumps({"warmup_prompt_tokens": s, **runs[s][-1]}), flush=True)
  rows, summary = [], {}
  for s, rs in runs.items():
    first = [r["requests"][0]["seconds"] for r in rs]
    summary[s] = {"health_s": statistics.median(r["health_s"] for r in rs),
                  "request_s": [statistics.median(r["requests"][i]["seconds"] for r in rs)
                                for i in range(len(MESSAGES))]}
    rows.append([s, summary[s]["health_s"],
                 " / ".join(f"{x:.2f}" for x in summary[s]["request_s"]), min(first)])
  print(markdown_table(["warmup_prompt_tokens", "s to /health", "request s (median)",
                        "first request s (best)"], rows))
  result = {"ckpt": args.ckpt, "messages": list(MESSAGES), "max_tokens": args.max_tokens,
            "prompt_tokens": [r["prompt_tokens"] for r in next(iter(runs.values()))[0]["requests"]],
            "summary": summary, "runs": {str(s): rs for s, rs in runs.items()}}
  return write_json(result, args.out, "benchmarks.speed.server_start", argv)


if __name__ == "__main__":
  main()
