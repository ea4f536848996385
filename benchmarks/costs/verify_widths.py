"""`--what verify_widths`: what a verified step's base forward costs at each width, per batch.

The shipped HAMburger-SmolLM2 with its verification drafter (`open_checkpoint(verify=True)`):
the base forward of W unmerged inputs per row (`forward_unmerged`, the KV cache read with 200
of 256 slots filled) plus the LM head and log-softmax at the W positions, at widths
1, 2, 4 and each batch size, the settings timed in rotation (median per call). The costs relative
to width 1 are what `hamburger_jax/decode/draft_width.py` holds as CPU_COSTS.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import machine, markdown_table
from hamburger_jax.decode.checkpoint import open_checkpoint
from hamburger_jax.decode.models import decode_model
from hamburger_jax.model.kv_cache import init_cache

WIDTHS = (1, 2, 4)
FILLED, CACHE_LENGTH = 200, 256


def _step_fn(model):
  def step(params, tokens, positions, cache, slots):
    feats, entries = model.forward_unmerged(params, tokens, positions, cache, slots)
    b, w = tokens.shape
    logits = model.heads(params, feats[:, :, -1].reshape(b * w, -1))[0]
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), entries
  return jax.jit(step)


def _inputs(cfg, batch: int, width: int, cache_length: int):
  cache = jax.tree_util.tree_map(lambda x: x + 0.01,
                                 init_cache(cfg, cfg.num_layers, batch, cache_length))
  positions = FILLED + jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (batch, width))
  return (jnp.ones((batch, width), jnp.int32), positions, cache,
          jnp.full((batch,), FILLED, jnp.int32))


def measure(args) -> tuple[dict, str]:
  d = open_checkpoint("smollm2", verify=True)
  model, params = decode_model(d.config, d.params, False, d.draft_vocab)
  params = jax.device_put(params)
  step = _step_fn(model)
  settings = [(b, w, _inputs(d.config.base, b, w, CACHE_LENGTH))
              for b in args.batch_sizes for w in WIDTHS]
  for _, _, x in settings:                                  # compile and warm up
    jax.block_until_ready(step(params, *x))
  times = {(b, w): [] for b, w, _ in settings}
  for _ in range(args.repeats):
    for b, w, x in settings:
      t0 = time.perf_counter()
      jax.block_until_ready(step(params, *x))
      times[(b, w)].append(time.perf_counter() - t0)
  rows = []
  for b in args.batch_sizes:
    ms = [float(np.median(times[(b, w)])) * 1e3 for w in WIDTHS]
    rows.append({"batch": b, "widths": list(WIDTHS), "ms": ms,
                 "relative": [m / ms[0] for m in ms]})
  result = {"machine": machine(), "filled_slots": FILLED, "repeats": args.repeats, "rows": rows}
  table = markdown_table(["batch"] + [f"width {w} ms (x width 1)" for w in WIDTHS],
                         [[r["batch"]] + [f"{m:.1f} ({x:.2f}x)" for m, x in
                                          zip(r["ms"], r["relative"])] for r in rows])
  return result, table
