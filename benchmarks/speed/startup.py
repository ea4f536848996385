r"""How long a decoding command takes to start: the README's first command with XLA's persistent
compilation cache off, cold (an empty cache) and warm (the programs of the cold run on disk), and
reading the shipped GGUF's header with this project's reader against the `gguf` package's.

    python -m benchmarks.decode_speed --engine startup       # the README's first command, ~4 min
    python -m benchmarks.decode_speed --engine startup --runs 2 --decode_args "--ckpt smollm2 --prompt Hi"

Each run is a fresh `python decode.py ...` process, its wall time from start to exit (loading,
compiling, decoding, printing). Writes serving/startup.json unless --out says otherwise.
"""

import argparse
import gc
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.common import REPO, markdown_table, results_dir, write_json

README_COMMAND = ('--ckpt smollm2 --prompt "What is the capital of France?" --verify '
                  '--show_groups --compare_base')


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--decode_args", default=README_COMMAND,
                      help="decode.py's arguments (default: the README's first command)")
  parser.add_argument("--runs", type=int, default=1, help="timed runs per setting (median kept)")
  parser.add_argument("--header_repeats", type=int, default=3)
  parser.add_argument("--out", default=os.path.join(results_dir("serving"), "startup.json"),
                      help="the JSON's path ('' = print only)")
  return parser


def time_decode(args: list[str], cache_dir: str) -> dict:
  """One `decode.py` process: wall seconds and its stdout."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  start = time.perf_counter()
  out = subprocess.run([sys.executable, os.path.join(REPO, "decode.py"), *args,
                        "--compilation_cache", cache_dir], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=1800, check=False)
  seconds = time.perf_counter() - start
  if out.returncode:
    raise SystemExit(f"decode.py exited with {out.returncode}:\n{out.stderr[-2000:]}")
  return {"seconds": round(seconds, 2), "stdout": out.stdout}


def time_header_readers(path: str, repeats: int) -> dict:
  """Median seconds to open the GGUF with each reader (fields and tensor index)."""
  import gguf  # pylint: disable=import-outside-toplevel
  from hamburger_jax.convert.gguf_index import GGUFIndex  # pylint: disable=import-outside-toplevel
  out = {}
  for name, read in (("gguf package", lambda: gguf.GGUFReader(path, "r")),
                     ("GGUFIndex", lambda: GGUFIndex(path))):
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      read()
      times.append(time.perf_counter() - start)
      gc.collect()
    out[name] = round(statistics.median(times), 3)
  return out


def main(argv=None, module: str = "benchmarks.speed.startup", command_argv=None) -> dict:
  """The whole run -> the result written to --out. module / command_argv: the command that
  the provenance names (default: this module and argv)."""
  parser = build_parser()
  a = parser.parse_args(argv)
  if a.runs < 1 or a.header_repeats < 1:
    parser.error("--runs and --header_repeats must be >= 1.")
  args = shlex.split(a.decode_args)
  from hamburger_jax.shipped import smollm2  # pylint: disable=import-outside-toplevel
  header = time_header_readers(smollm2.gguf_path(), a.header_repeats)
  runs = {"cache off": [], "cold cache": [], "warm cache": []}
  outputs = set()
  for _ in range(a.runs):
    with tempfile.TemporaryDirectory(prefix="hamburger_startup_") as cache:
      for setting, directory in (("cache off", ""), ("cold cache", cache),
                                 ("warm cache", cache)):
        run = time_decode(args, directory)
        runs[setting].append(run["seconds"])
        outputs.add(run["stdout"].split("tokens/s")[0])     # the answer, before the timings
  seconds = {k: statistics.median(v) for k, v in runs.items()}
  result = {"decode_args": args, "runs": runs, "median_seconds": seconds,
            "warm_over_cold": round(seconds["warm cache"] / seconds["cold cache"], 3),
            "same_answer_every_run": len(outputs) == 1,
            "gguf_header_seconds": header, "gguf": smollm2.GGUF_NAME}
  print(markdown_table(["decode.py run", "seconds (median)", "runs"],
                       [[k, f"{v:.1f}", len(runs[k])] for k, v in seconds.items()]))
  print()
  print(markdown_table(["GGUF header reader", "seconds (median)"],
                       [[k, f"{v:.3f}"] for k, v in header.items()]))
  write_json(result, a.out, module, argv if command_argv is None else command_argv)
  print(f"\nwarm / cold: {result['warm_over_cold']}; the same answer in every run: "
        f"{result['same_answer_every_run']}")
  return result


if __name__ == "__main__":
  main()
