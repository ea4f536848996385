"""Where one decode step's bytes go on a TPU chip: XLA's bytes accessed op by op, grouped, beside
the floor. Used by `python -m benchmarks.tpu_plan --explain`.

    python -m benchmarks.tpu_plan --train none --decode 1b@v5e:2x2:8:4096 --explain

One step is one iteration of the decode loop's `while` (a macro step; a base step emits one
token). Loops inside it count their trips: the base's attention over KV blocks the blocks of
`fill` slots (default: all of them, the worst case), the micro-step loop its steps. The floor: every weight read once, the LM head (or, with a draft vocabulary, its K rows drafts
choose from) once more per drafting micro step and the micro-step decoder once more per extra
pass (HAMburger: S passes, its prefill over the features and S - 1 steps; verified decoding:
S - 1, the prefill fused with draft 1, and no embedder read), and the KV cache in use read
once. Per step two figures: XLA's (its accounting, op by op
`hlo_bytes.attribute`, loops weighted) and the HBM traffic alone (VMEM copies of prefetched
weights and buffers dropped).
"""

from __future__ import annotations

import jax

from benchmarks.common import markdown_table
from hamburger_jax.train import hlo_bytes

GB = 1e9
BASE_ATTENTION = r"^(?!.*micro).*self_attn/while$"     # the base's loop over KV blocks


def _bytes(tree) -> float:
  return float(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def floor_bytes(cfg, model: str, batch: int, slots: int, fill: int | None = None,
                draft_vocab: int = 0, quantize: str = "none", kv_cache: str = "model") -> dict:
  """Bytes one step must read: {"weights", "repeats", "kv_cache", "total"} (see the module
  docstring). model: "base", "hamburger" or "verify". draft_vocab: K > 0 = the S - 1 drafting
  micro steps read the K + REST_SAMPLE rows of the head they draft from, not all of it.
  quantize / kv_cache: the weights' and the KV buffers' formats, as decoding stores them."""
  from hamburger_jax.decode.draft_vocab import REST_SAMPLE
  from hamburger_jax.decode.models import decode_model
  from hamburger_jax.model.kv_cache import init_cache
  from hamburger_jax.model.hamburger import init_params
  from hamburger_jax.model import quantize as quantize_lib
  from hamburger_jax.model.quantize import apply_mode
  params = jax.eval_shape(lambda: apply_mode(init_params(cfg, jax.random.PRNGKey(0)), cfg.base,
                                             quantize))
  _, decode_params = decode_model(cfg, params, base=model == "base")
  if model == "verify":                   # plain tokens: no merge, the embedder is never read
    decode_params = {k: v for k, v in decode_params.items() if k != "embedder"}
  llama = cfg.base
  cache = jax.eval_shape(lambda: init_cache(llama, llama.num_layers, batch, slots, kv_cache))
  kv = _bytes(cache) * min(fill or slots, slots) / slots
  repeats = 0.0
  if model != "base":
    rows = min(draft_vocab + REST_SAMPLE, llama.vocab_size) if draft_vocab else llama.vocab_size
    # Drafts read the int8 head itself, or (with a draft vocabulary) rows gathered in bf16,
    # int8 when the drafter alone is int8 ("micro:int8"; then the head itself stays float).
    drafter_only = quantize_lib.drafter_only(quantize)
    int8_head = quantize != "none" and (drafter_only if draft_vocab else not drafter_only)
    head = rows * llama.hidden_size * (1 if int8_head else
                                       jax.numpy.dtype(cfg.base.param_dtype).itemsize)
    # Micro-decoder passes: HAMburger's prefill and S - 1 steps; verified drafting fuses the
    # prefill with draft 1 (S - 1 passes). One of them is in "weights".
    passes = cfg.max_steps - (model == "verify")
    repeats = ((cfg.max_steps - 1) * head
               + (passes - 1) * _bytes(params["micro_decoder"]))
  weights = _bytes(decode_params)
  return {"weights": weights, "repeats": repeats, "kv_cache": kv,
          "total": weights + repeats + kv}


def per_chip(attribution: dict, weight_share: float, kv_share: float) -> dict:
  """A mesh step's attribution (`inspector`; its bytes are one chip's) with the floor cut to
  one chip's shards: weights and repeats by `weight_share`, the KV cache by `kv_share` (the
  fractions of all weights / KV buffers one chip holds)."""
  f = attribution["floor"]
  floor = {"weights": f["weights"] * weight_share, "repeats": f["repeats"] * weight_share,
           "kv_cache": f["kv_cache"] * kv_share}
  floor["total"] = sum(floor.values())
  return {**attribution, "floor": floor, "floor_whole_model": f,
          "hbm_over_floor": attribution["hbm_step"] / floor["total"],
          "xla_over_floor": attribution["xla_step"] / floor["total"]}


def inspector(cfg, model: str, batch: int, slots: int, fill: int | None = None, top: int = 12,
              draft_vocab: int = 0, quantize: str = "none", kv_cache: str = "model"):
  """compiled -> {"bytes": the step's attribution against its floor} (an `aot` inspect hook)."""
  from hamburger_jax.model.kv_attention import KV_BLOCK

  def inspect(compiled) -> dict:
    blocks = -(-min(fill or slots, slots) // min(KV_BLOCK, slots))
    report = hlo_bytes.attribute(compiled.as_text(), trips={BASE_ATTENTION: blocks},
                                 per_step=True)
    floor = floor_bytes(cfg, model, batch, slots, fill, draft_vocab, quantize, kv_cache)
    ops = [{k: r[k] for k in ("name", "opcode", "op_name", "shape", "count")}
           | {"xla": r["xla"] * r["count"], "hbm": r["hbm"] * r["count"],
              "hbm_groups": {g: b * r["count"] for g, b in r["groups"]["hbm"].items()}}
           for r in report["ops"][:top]]
    by_opcode = {}
    for r in report["ops"]:
      xla, hbm = by_opcode.get(r["opcode"], (0.0, 0.0))
      by_opcode[r["opcode"]] = (xla + r["xla"] * r["count"], hbm + r["hbm"] * r["count"])
    return {"bytes": {"fill": fill or slots, "xla_once": report["xla_once"],
                      "xla_step": report["xla"], "hbm_step": report["hbm"],
                      "groups": report["groups"], "floor": floor,
                      "hbm_over_floor": report["hbm"] / floor["total"],
                      "xla_over_floor": report["xla"] / floor["total"],
                      "loops": report["loops"], "top_ops": ops, "by_opcode": by_opcode}}
  return inspect


def table(rows) -> str:
  """Decode rows with a "bytes" field -> one markdown table (GB per step)."""
  cells = []
  for r in rows:
    b = r.get("bytes")
    if not b:
      continue
    xla, hbm = b["groups"]["xla"], b["groups"]["hbm"]
    vocab = f" K={r['draft_vocab']}" if r.get("draft_vocab") else ""
    vocab += f" {r['quantize']}" if r.get("quantize", "none") != "none" else ""
    vocab += " kv int8" if r.get("kv_cache") == "int8" else ""
    cells.append([f"{r['model']}{vocab} b{r['batch']}", f"{r['bytes_accessed'] / GB:.2f}",
                  f"{b['xla_once'] / GB:.2f}", f"{b['xla_step'] / GB:.2f}",
                  f"{b['hbm_step'] / GB:.2f}", f"{b['floor']['total'] / GB:.2f}",
                  f"{b['xla_over_floor']:.2f}", f"{b['hbm_over_floor']:.2f}"]
                 + [f"{xla[g] / GB:.2f} / {hbm[g] / GB:.2f}" for g in hlo_bytes.GROUPS])
  return markdown_table(
      ["step", "XLA total", "attributed (loops once)", "XLA way / step", "HBM / step", "floor",
       "XLA / floor", "HBM / floor"] + [f"{g} (XLA / HBM)" for g in hlo_bytes.GROUPS], cells)


def opcode_table(row, n: int = 8) -> str:
  """The step's bytes by op kind (GB per step): XLA's count and the HBM traffic."""
  kinds = sorted(row["bytes"]["by_opcode"].items(), key=lambda kv: -kv[1][0])[:n]
  return markdown_table(["op kind", "XLA GB", "HBM GB"],
                        [[k, f"{x / GB:.3f}", f"{h / GB:.3f}"] for k, (x, h) in kinds])


def top_table(row, n: int = 8) -> str:
  """The step's costliest ops by XLA's count (GB per step, times they run)."""
  ops = row["bytes"]["top_ops"][:n]
  return markdown_table(["op", "what", "runs", "XLA GB", "HBM GB"],
                        [[o["name"], (o["op_name"] or o["opcode"])[-60:], f"{o['count']:g}",
                          f"{o['xla'] / GB:.3f}", f"{o['hbm'] / GB:.3f}"] for o in ops])
