"""`--what verify_profile`: where a verified step's time goes, part by part of the model.

The shipped HAMburger-SmolLM2 with its verification drafter decodes held-out mixed prompts by
verified decoding (greedy, 48 tokens, lookup drafts on) with each step's drafts capped at 3
(`max_group` 4), as `verify_steps` times its widest setting: once to compile, once timed, once
under `jax.profiler`. Every XLA op of the loop's executable in the trace is assigned to a part
of the step by the op_name metadata of the compiled loop's HLO (`PARTS`, first match; loops and
branches, whose time is their body's, are left out). Figures are ms of thread time per loop
iteration: ops of two threads overlap, so the parts add up to more than the wall time per
iteration (reported beside them, from the timed run).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import tempfile

from benchmarks.common import machine, markdown_table
from benchmarks.costs.verify_steps import MAX_NEW_TOKENS, _prompts, verify_sampler
from hamburger_jax.decode.checkpoint import open_checkpoint

WIDTH = 4
PARTS = (("drafter", ("micro",)),
         ("attention over the KV buffer", ("self_attn/while", "self_attn/new_entries")),
         ("attention projections", ("self_attn",)),
         ("MLP", ("mlp",)),
         ("LM head", ("logits",)))
OTHER = "everything else"
PART_NAMES = tuple(part for part, _ in PARTS) + (OTHER,)
LOOP_MODULE = "jit_loop"                        # the decode loop's executable in a trace
CONTROL = ("while", "conditional", "call")     # their time is their body's, counted there
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*? ([a-z][\w\-]*)\(.*?"
                          r"op_name=\"([^\"]*)\"", re.M)


def op_parts(hlo_text: str) -> dict[str, str]:
  """HLO instruction name -> its part of the step (PARTS, else OTHER); control flow left out."""
  parts = {}
  for name, opcode, op_name in _INSTRUCTION.findall(hlo_text):
    if opcode not in CONTROL:
      parts[name] = next((part for part, keys in PARTS if any(k in op_name for k in keys)),
                         OTHER)
  return parts


def thread_ms(trace_events, parts: dict[str, str], iterations: int,
              module: str = LOOP_MODULE) -> dict[str, float]:
  """Complete trace events ("ph" X) of `module`'s ops in `parts` -> ms of thread time per
  iteration (other executables, such as the prefill, reuse the same op names)."""
  total = collections.Counter()
  for e in trace_events:
    if (e.get("ph") == "X" and e.get("name") in parts
        and e.get("args", {}).get("hlo_module") == module):
      total[parts[e["name"]]] += e.get("dur", 0) / 1e3
  return {part: total[part] / iterations for part in PART_NAMES}


def _loop_hlo(sampler) -> str:
  return next(c.as_text() for key, c in sampler.executables.compiled.items()
              if key[0] == "loop")


def measure(args) -> tuple[dict, str]:
  import jax  # pylint: disable=import-outside-toplevel
  d = open_checkpoint("smollm2", verify=True)
  rows = []
  for b in args.batch_sizes:
    prompts = _prompts(d, b)
    sampler = verify_sampler(d, prompts, draft_width_rule=False)
    run = lambda: sampler.decode(prompts[:b], max_new_tokens=MAX_NEW_TOKENS, confidence=0.001,
                                 min_token_prob=0.0, max_group=WIDTH)
    run()                                                       # compile
    timed = run()
    iterations = max(timed.macro_steps)
    with tempfile.TemporaryDirectory() as trace_dir:
      jax.profiler.start_trace(trace_dir)
      run()
      jax.profiler.stop_trace()
      path = sorted(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))[-1]
      with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    ms = thread_ms(events, op_parts(_loop_hlo(sampler)), iterations)
    rows.append({"batch": b, "width": WIDTH, "iterations": iterations,
                 "wall_ms_per_iteration": timed.decode_s / iterations * 1e3,
                 "thread_ms_per_iteration": ms})
  table = markdown_table(
      ["batch", "wall ms / iteration"] + [f"{p} ms" for p in PART_NAMES],
      [[r["batch"], f"{r['wall_ms_per_iteration']:.1f}"]
       + [f"{r['thread_ms_per_iteration'][p]:.1f}" for p in PART_NAMES] for r in rows])
  return {"machine": machine(), "max_new_tokens": MAX_NEW_TOKENS, "rows": rows}, table
