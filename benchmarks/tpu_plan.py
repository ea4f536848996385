r"""What fits which TPU slice: AOT-compiles train steps and decode loops with the real XLA TPU
compiler on this (CPU) host and prints JSON lines plus a table.

    nice -n 10 python -m benchmarks.tpu_plan                        # the README plan
    python -m benchmarks.tpu_plan --train llama3_1b@v5e:2x4 --decode none
    python -m benchmarks.tpu_plan --train none --decode 1b@v5e:2x2:8:4096
    python -m benchmarks.tpu_plan --train none --decode 1b@v5e:2x2:8:4096 --explain
    python -m benchmarks.tpu_plan --train none --decode 1b@v5e:2x2:1:4096 --quantize int8
    python -m benchmarks.tpu_plan --train none --decode 1b@v5e:2x2:8:4096 --models verify base \
        --draft_vocab 8192 --explain

Train entries are `config@topology[:key=value,..]` (a configs/ module; overrides of its fields,
e.g. `llama3_1b@v5e:2x4:data.batch_size=16,model.remat=save_dots`). Decode entries are
`size@topology:batch:slots` (one chip of the topology; HAMburger and base decoding both) or
`size@topology:batch:slots:mesh` (one model over the slice's chips, `decode/mesh.py`, e.g.
`8b@v5e:2x4:8:4096:tensor=8`; memory and bytes per chip).
Per chip: XLA's argument / temporary / total bytes against the chip's HBM. Per optimizer step:
the matmul FLOPs of the optimized program summed over chips, every while loop (scanned layers,
loss chunks, gradient accumulation) weighted by its trip count (`hamburger_jax.train.hlo_flops`
walks the optimized HLO: XLA's own cost analysis counts a loop body once, `xla_cost_flops`), and
their ratio to the model FLOPs (6 N tokens + causal attention, see `model_flops`): the
rematerialisation overhead. Decode: XLA's bytes accessed by the loop program (while-loop
bodies counted once: one macro step whose micro-step loop runs once) and the memory-bound time of
that step, bytes / HBM bandwidth (`step_ms_at_hbm_bw`; v5e 819 GB/s); XLA's bytes exceed one
read of the weights and the KV cache, whose time is the floor (`weights_kv_ms_at_hbm_bw`).
Needs libtpu (requirements-test.txt).
--explain: each decode step's bytes op by op, grouped (weights, KV cache, activations, copies)
beside its floor, XLA's accounting and the HBM traffic alone (`benchmarks.tpu.step_bytes`); on
a mesh both are one chip's (the floor: its shards of the weights and the KV cache).
--draft_vocab K: HAMburger's and verified decoding's drafts choose from K ids
(`decode/draft_vocab.py`), so a drafting micro step reads K rows of the LM head, not all.
--micro_layers N: the micro decoder (drafter) has N layers instead of the preset's.
--draft_branches C: verified decoding drafts C chains and checks them as one tree a forward
(`decode/draft_tree.py`: 1 + C (S - 1) inputs a row).
--kv_cache int8: the KV buffers store int8 with a float32 scale per head vector.
Writes {"rows": [...], "provenance"} to --out after every entry (default
docs/results/data/tpu/tpu_plan.json).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import jax

from benchmarks.tpu import step_bytes
from benchmarks.common import markdown_table, results_dir, write_json
from hamburger_jax.model.hamburger import init_params, param_count
from hamburger_jax.train import aot
from hamburger_jax.train.run_config import model_config

DEFAULT_TRAIN = ("llama3_1b@v5e:2x4", "llama3_1b@v5p:2x2x1", "llama3_3b@v5p:2x2x1",
                 "llama3_8b@v5p:2x2x2")
DEFAULT_DECODE = tuple(f"1b@v5e:2x2:{b}:4096" for b in (1, 8, 64))
DECODE_MODELS = ("hamburger", "verify", "base")
_DECODE_PRESETS = {"1b": "llama3.2-1b", "3b": "llama3.2-3b", "8b": "llama3.1-8b"}


def _set(config, key: str, value: str):
  *path, last = key.split(".")
  node = config
  for p in path:
    node = node[p]
  old = node[last]
  node[last] = (value.lower() in ("1", "true") if isinstance(old, bool) else
                value if isinstance(old, str) else type(old)(float(value)))


def load_config(entry: str):
  """'config@topology[:k=v,..]' -> (ml_collections config, topology)."""
  name, rest = entry.split("@", 1)
  chip, shape, *overrides = rest.split(":", 2)
  topology, overrides = f"{chip}:{shape}", (overrides or [""])[0]
  config = importlib.import_module(f"configs.{name}").get_config()
  for kv in filter(None, overrides.split(",")):
    key, value = kv.split("=", 1)
    _set(config, key, value)
  return config, topology


def model_flops(config) -> float:
  """Useful FLOPs of one optimizer step: 6 x params x tokens each part sees + causal attention.

  Base layers see B x M macro inputs, the micro decoder B x M x (F + S - 1) inputs, the LM head
  and the stop head B x M x S outputs; attention adds 12 x L x T^2 / 2 x heads x head_dim per row
  (forward + backward, causal half). Embedding lookups are free; the embedder is counted as
  6 x its params x B x M.
  """
  cfg = model_config(config)
  b, m, s, f = config.data.batch_size, config.data.seq_len, cfg.max_steps, cfg.num_features
  shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
  base, c = shapes["base"], cfg.base
  layer = param_count(base["layers_0"])
  head = c.vocab_size * c.hidden_size
  micro_len = f + s - 1
  attn = lambda rows, t, layers: 12 * layers * rows * t * t / 2 * c.num_heads * c.head_dim
  total = 6 * layer * c.num_layers * b * m + attn(b, m, c.num_layers)
  total += 6 * param_count(shapes["embedder"]) * b * m
  micro = shapes["micro_decoder"]
  total += 6 * layer * cfg.num_micro_layers * b * m * micro_len
  total += attn(b * m, micro_len, cfg.num_micro_layers)
  total += 6 * (head + param_count(micro["stop_head"])) * b * m * s
  return float(total)


def train_row(entry: str) -> dict:
  config, topology = load_config(entry)
  devices = aot.topology_devices(topology)
  report = aot.compile_train_step(config, devices)
  row = {"kind": "train", "entry": entry, "topology": topology, "chips": len(devices),
         "batch": f"{config.data.batch_size}x{config.data.seq_len}",
         "remat": config.model.remat, "attention": config.model.attention,
         "scan": bool(config.model.scan_layers), **report}
  if report["fits"]:
    row["model_flops"] = model_flops(config)
    row["xla_cost_flops"] = report["flops"] * len(devices)
    row["xla_flops_total"] = report["matmul_flops"] * len(devices)
    row["flops_ratio"] = row["xla_flops_total"] / row["model_flops"]
  return row


def decode_rows(entry: str, models=DECODE_MODELS, explain: bool = False, fill: int | None = None,
                quantize: str = "none", draft_vocab: int = 0,
                micro_layers: int | None = None, kv_cache: str = "model",
                verify_steps: int | None = None, draft_branches: int = 1) -> list[dict]:
  """explain: each row also gets "bytes", the step's byte attribution (`tpu.step_bytes`);
  quantize: "int8" / "int8:G" compiles the loops with int8 weights (`model/quantize.py`; G: a
  scale per group of G inputs; "micro:int8": the drafter's alone); draft_vocab: K > 0
  = drafts choose from K ids (the base's rows have none); micro_layers: the micro decoder's
  depth (None: the preset's); kv_cache: what the KV buffers store ("model" or "int8");
  verify_steps: verified decoding's inputs per row and forward (None: the preset's max_steps);
  draft_branches: verified decoding checks a tree of this many draft chains (`draft_tree`)."""
  size, chip, shape, batch, slots, *mesh = entry.replace("@", ":").split(":")
  from hamburger_jax.model.config import get_preset
  cfg = get_preset(_DECODE_PRESETS[size], dtype="bfloat16", param_dtype="bfloat16")
  cfg = cfg.replace(num_micro_layers=micro_layers or cfg.num_micro_layers)
  devices = aot.topology_devices(f"{chip}:{shape}", None if mesh else 1)
  device = devices if mesh else devices[0]          # a mesh spans the slice's chips
  rows = []
  for model in models:
    k = 0 if model == "base" else draft_vocab
    inspect = (step_bytes.inspector(cfg, model, int(batch), int(slots), fill, draft_vocab=k,
                                    quantize=quantize, kv_cache=kv_cache) if explain else None)
    report = aot.compile_decode_loop(cfg, device, batch=int(batch), cache_length=int(slots),
                                     base=model == "base", verify=model == "verify",
                                     inspect=inspect, quantize=quantize,
                                     mesh=mesh[0] if mesh else None, draft_vocab=k,
                                     kv_cache=kv_cache, verify_steps=verify_steps,
                                     draft_branches=draft_branches)
    if mesh and "bytes" in report:         # XLA's bytes are one chip's: so is the floor
      report["bytes"] = step_bytes.per_chip(
          report["bytes"], report["param_gib_per_chip"] / report["param_gib"],
          report["kv_cache_gib_per_chip"] / report["kv_cache_gib"])
    rows.append({"kind": "decode", "entry": entry, "model": model, "quantize": quantize,
                 "kv_cache": kv_cache,
                 "draft_vocab": k, "micro_layers": cfg.num_micro_layers,
                 "verify_steps": (verify_steps or cfg.max_steps) if model == "verify" else None,
                 "draft_branches": draft_branches if model == "verify" else None,
                 "batch": int(batch), "slots": int(slots), **report,
                 "step_ms_at_hbm_bw": report.get("bytes_accessed", 0.0)
                 / (aot.HBM_GBPS[chip] * 1e9) * 1e3,
                 "weights_kv_ms_at_hbm_bw": _floor_gib(report)
                 * aot.GIB / (aot.HBM_GBPS[chip] * 1e9) * 1e3})
  return rows


def _floor_gib(report) -> float:
  """GiB a chip reads at least per decode step: its weights and KV cache (its shards on a mesh)."""
  return (report.get("param_gib_per_chip", report["param_gib"])
          + report.get("kv_cache_gib_per_chip", report["kv_cache_gib"]))


def _quantize_mode(text: str) -> str:
  """--quantize's value, checked by `model/quantize.parse_mode` (argparse's one-line error)."""
  from hamburger_jax.model import quantize  # pylint: disable=import-outside-toplevel
  try:
    return quantize.parse_mode(text) or "none"
  except quantize.QuantizeError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


def table(rows) -> str:
  """The rows as a markdown table (GiB per chip; a row that does not fit gives XLA's error)."""
  cells = []
  for r in rows:
    int8 = f" {r['quantize']}" if r.get("quantize", "none") != "none" else ""
    int8 += f" draft vocab {r['draft_vocab']}" if r.get("draft_vocab") else ""
    int8 += f" kv {r['kv_cache']}" if r.get("kv_cache", "model") != "model" else ""
    int8 += f" {r['draft_branches']} chains" if (r.get("draft_branches") or 1) > 1 else ""
    what = (f"train {r['entry']}" if r["kind"] == "train" else
            f"decode {r['model']}{int8} {r['entry']}")
    if not r["fits"]:
      cells.append([what, f"does not fit: {r.get('error', '')[:90]}"] + [""] * 9)
      continue
    cells.append([
        what, f"{r['argument_gib']:.2f}", f"{r['temp_gib']:.2f}", f"{r['total_gib']:.2f}",
        f"{r['hbm_gib']:.2f}", f"{100 * r['hbm_free_frac']:.0f}%",
        f"{r.get('xla_flops_total', r['flops']) / 1e12:.1f}", f"{r.get('flops_ratio', 0):.2f}",
        f"{r['bytes_accessed'] / 1e9:.2f}", f"{r.get('step_ms_at_hbm_bw', 0):.2f}",
        f"{r['compile_s']:.0f}"])
  return markdown_table(["what", "args", "temp", "total", "HBM", "free", "TFLOP", "ratio",
                         "GB accessed", "ms at HBM bw", "compile s"], cells)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--train", nargs="*", default=list(DEFAULT_TRAIN))
  p.add_argument("--decode", nargs="*", default=list(DEFAULT_DECODE))
  p.add_argument("--out", default=None,
                 help="the JSON, rewritten after each entry ('' = print only; default "
                 "docs/results/data/tpu/tpu_plan.json, with --explain decode_bytes.json)")
  p.add_argument("--explain", action="store_true",
                 help="decode: attribute each step's bytes op by op against the floor")
  p.add_argument("--models", nargs="*", default=list(DECODE_MODELS), choices=DECODE_MODELS,
                 help="decode loops to compile")
  p.add_argument("--fill", type=int, default=None,
                 help="--explain: KV slots in use per row (default: all)")
  p.add_argument("--quantize", default="none", type=_quantize_mode,
                 help="decode: the weights' format (int8: per-channel scales, int8:G: a scale "
                      "per group of G inputs, micro:int8: the drafter alone; model/quantize.py)")
  p.add_argument("--draft_vocab", type=int, default=0,
                 help="decode: drafts choose from this many token ids (0: the whole vocabulary)")
  p.add_argument("--kv_cache", default="model", choices=("model", "int8"),
                 help="decode: what the KV buffers store (model/kv_cache.py)")
  p.add_argument("--verify_steps", type=int, default=None,
                 help="decode: verified decoding's inputs per row and forward (drafts + 1; "
                      "default: the preset's max_steps)")
  p.add_argument("--draft_branches", type=int, default=1,
                 help="decode: verified decoding checks a tree of this many draft chains "
                      "(decode/draft_tree.py; default 1: one chain)")
  p.add_argument("--micro_layers", type=int, default=None,
                 help="decode: the micro decoder's layers (default: the preset's)")
  args = p.parse_args(argv)
  if args.verify_steps is not None and not 2 <= args.verify_steps <= 16:
    p.error(f"--verify_steps must be in 2..16, got {args.verify_steps}.")
  if args.verify_steps is not None and args.explain:
    p.error("--verify_steps: the byte attribution (--explain) reads the preset's depth only.")
  if not 1 <= args.draft_branches <= 8:
    p.error(f"--draft_branches must be in 1..8, got {args.draft_branches}.")
  if args.micro_layers is not None and args.micro_layers < 1:
    p.error(f"--micro_layers must be >= 1, got {args.micro_layers}.")
  if args.draft_vocab < 0:
    p.error(f"--draft_vocab must be >= 0 (0: the whole vocabulary), got {args.draft_vocab}.")
  if args.out is None:
    args.out = os.path.join(results_dir("tpu"),
                            "decode_bytes.json" if args.explain else "tpu_plan.json")
  if not aot.libtpu_available():
    sys.exit("tpu_plan needs libtpu: pip install 'libtpu==0.0.42.*'.")
  rows = []

  def add(row):
    rows.append(row)
    print(json.dumps(row), flush=True)
    write_json({"rows": rows}, args.out, __spec__.name, argv)

  for entry in (e for e in args.decode if e != "none"):
    for row in decode_rows(entry, args.models, args.explain, args.fill, args.quantize,
                           args.draft_vocab, args.micro_layers, args.kv_cache,
                           args.verify_steps, args.draft_branches):
      add(row)
  for entry in (e for e in args.train if e != "none"):
    add(train_row(entry))
  print("Machine: this CPU host compiling for abstract TPU chips (libtpu); GiB per chip.")
  print(table(rows))
  if args.explain:
    print("Bytes per decode step, GB (XLA's accounting / HBM traffic alone):")
    print(step_bytes.table(rows))
    for r in (r for r in rows if r.get("bytes")):
      print(f"\n{r['model']} {r['entry']}: bytes per step by op kind\n"
            f"{step_bytes.opcode_table(r)}\ncostliest ops\n{step_bytes.top_table(r)}")


if __name__ == "__main__":
  main()
