"""`--engine sampler`: plain base-model decoding vs HAMburger, same prompts, same weights.

For every batch size and output length: plain decoding (one token per base forward) and HAMburger
at each confidence, greedy, no EOS (outputs have exactly the requested length). Reported: decode
tokens/s (compile excluded), tokens per KV slot (= tokens per base forward), KV slots used vs
plain decoding's, and the loop overhead: the decode loop's time divided by (loop iterations x
the time of ONE compiled base forward of a single input per row at the same cache size). For
HAMburger that ratio also holds the micro-decoder steps.

Random weights (no --ckpt) say nothing about quality or about a trained model's group lengths.
Their stop decisions are made realistic this way: every matrix is drawn with std 0.08
(hamburger_jax.testing.fixtures.random_params), then the stop head's last layer (kernel scale and
bias) is set so that the stop logits seen while decoding the benchmark's own prompts (all rows of
the largest batch) have mean --stop_mean and std --stop_std (two passes: decoding with full
groups, then at confidence 0.8). Continue-probabilities then spread over (0, 1) and groups get
1..4 tokens depending on the confidence. Random weights also repeat tokens, and how long the
groups get differs a lot from prompt to prompt: the table reports what happened, row by row.
In a batch, the loop runs until its slowest row is done (static batching).
"""

from __future__ import annotations

import dataclasses
import platform
import time

import jax
import numpy as np

from hamburger_jax.decode.checkpoint import open_checkpoint
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.model.config import BASE_PRESETS, HamburgerConfig, get_preset
from hamburger_jax.model.hamburger import param_count
from hamburger_jax.testing.fixtures import random_params, rescale_stop_head

# 'small': a few million parameters, wide enough that the matmuls dominate on a CPU.
SMALL = HamburgerConfig(
    base=dataclasses.replace(BASE_PRESETS["tiny"], vocab_size=4096, hidden_size=256,
                             intermediate_size=768, num_layers=8, num_heads=8, num_kv_heads=2,
                             head_dim=32),
    feature_layers=(1, 3, 5))


class WeightsError(ValueError):
  """--ckpt names weights this engine cannot benchmark."""


def load_weights(args):
  """-> (cfg, params, description). Random weights unless args.ckpt."""
  if args.ckpt:
    d = open_checkpoint(args.ckpt, base_config=args.base_config, token_ids=True,
                        draft_vocab="full")
    if d.base_only:
      raise WeightsError(f"{args.ckpt} is a plain Llama: HAMburger weights are needed.")
    return d.config, d.params, f"checkpoint {args.ckpt}"
  cfg = SMALL if args.preset == "small" else get_preset(args.preset)
  params = random_params(cfg, args.seed, stop_mean=args.stop_mean, stop_std=args.stop_std)
  params = calibrate_on_decoding(cfg, params, args)
  return cfg, params, (f"random weights, preset {args.preset}, stop logits set to mean "
                       f"{args.stop_mean} / std {args.stop_std} while decoding (no quality "
                       "meaning)")


def benchmark_prompts(args, vocab_size: int, rows: int):
  """The same random prompts for every setting: batch b decodes the first b."""
  rng = np.random.default_rng(args.seed)
  return rng.integers(3, vocab_size, (rows, args.prompt_len)).tolist()


def calibrate_on_decoding(cfg, params, args, new_tokens: int = 64):
  """Rescales the stop head on the stop logits met while decoding the prompts (see top)."""
  prompts = benchmark_prompts(args, cfg.base.vocab_size, max(args.batch_sizes))
  for confidence in (1e-6, 0.8):
    sampler = Sampler(cfg, params, cache_length=-(-(args.prompt_len + new_tokens) // 64) * 64,
                      out_length=new_tokens)
    r = sampler.decode(prompts, max_new_tokens=new_tokens, confidence=confidence, eos_ids=[])
    params = rescale_stop_head(params, np.concatenate(r.stop_logits), args.stop_mean,
                               args.stop_std)
  return params


def time_setting(sampler, prompts, n, repeats, **knobs):
  """Compiles (untimed), then the fastest of `repeats` runs -> (result, compile_s)."""
  first = sampler.decode(prompts, max_new_tokens=n, eos_ids=[], **knobs)
  best = None
  for _ in range(repeats):
    r = sampler.decode(prompts, max_new_tokens=n, eos_ids=[], **knobs)
    if best is None or r.decode_s < best.decode_s:
      best = r
  return best, first.compile_s


def forward_seconds(sampler, prompts, repeats: int):
  """One compiled base forward of a single input per row at the sampler's cache size."""
  state, _ = sampler.start(prompts, max_new_tokens=1)
  return sampler.time_forward(state, repeats)


def record(mode, batch, n, confidence, r, compile_s, fwd_s):
  s = r.stats()
  return {
      "mode": mode, "batch": batch, "new_tokens": n, "confidence": confidence,
      "tokens_per_s": s["decode_tokens_per_s"], "decode_s": r.decode_s,
      "tokens_per_kv_slot": s["tokens_per_macro_step"],
      "kv_slots_used": s["kv_slots_used"], "kv_slots_base": s["kv_slots_base"],
      "loop_iterations": r.iterations, "forward_ms": fwd_s * 1e3,
      "loop_overhead": r.decode_s / max(r.iterations * fwd_s, 1e-12),
      "prefill_ms": r.prefill_s * 1e3, "compile_s": compile_s,
  }


def run_benchmark(cfg, params, args, lengths, repeats):
  """Every batch size x length: the base, then HAMburger at each confidence -> records."""
  all_prompts = benchmark_prompts(args, cfg.base.vocab_size, max(args.batch_sizes))
  records = []
  for b in args.batch_sizes:
    prompts = all_prompts[:b]
    for n in lengths:
      size = dict(cache_length=-(-(args.prompt_len + n) // 64) * 64, out_length=n)
      base = Sampler(cfg, params, base=True, **size)
      ham = Sampler(cfg, params, **size)
      r, c = time_setting(base, prompts, n, repeats)
      fwd = forward_seconds(base, prompts, args.forward_repeats)
      records.append(record("base", b, n, None, r, c, fwd))
      print(_row(records[-1], records[-1]), flush=True)
      fwd = forward_seconds(ham, prompts, args.forward_repeats)
      for conf in args.confidences:
        r, c = time_setting(ham, prompts, n, repeats, confidence=conf)
        records.append(record("hamburger", b, n, conf, r, c, fwd))
        print(_row(records[-1], _base_of(records, b, n)), flush=True)
  return records


def _base_of(records, b, n):
  return next(r for r in records if r["mode"] == "base" and r["batch"] == b
              and r["new_tokens"] == n)


HEADER = (f"{'mode':<10} {'B':>2} {'new':>5} {'conf':>4} {'tok/s':>9} {'vs base':>7} "
          f"{'tok/slot':>8} {'KV used/base':>13} {'iters':>5} {'fwd ms':>7} {'loop/fwd':>8} "
          f"{'compile s':>9}")


def _row(r, base):
  conf = "-" if r["confidence"] is None else f"{r['confidence']:.1f}"
  kv = f"{r['kv_slots_used']}/{r['kv_slots_base']}"
  return (f"{r['mode']:<10} {r['batch']:>2} {r['new_tokens']:>5} {conf:>4} "
          f"{r['tokens_per_s']:>9.1f} {r['tokens_per_s'] / base['tokens_per_s']:>6.2f}x "
          f"{r['tokens_per_kv_slot']:>8.2f} {kv:>13} {r['loop_iterations']:>5} "
          f"{r['forward_ms']:>7.3f} {r['loop_overhead']:>8.2f} {r['compile_s']:>9.1f}")


def plot(records, path) -> bool:
  """Tokens/s and tokens per KV slot by confidence -> a PNG at path (False without matplotlib)."""
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError:
    print("matplotlib is not installed: no plot (pip install matplotlib).")
    return False
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
  keys = sorted({(r["batch"], r["new_tokens"]) for r in records})
  for i, (b, n) in enumerate(keys):
    ham = [r for r in records
           if r["mode"] == "hamburger" and (r["batch"], r["new_tokens"]) == (b, n)]
    base = _base_of(records, b, n)
    xs = [r["confidence"] for r in ham]
    color = f"C{i}"
    ax1.plot(xs, [r["tokens_per_s"] for r in ham], "o-", color=color, label=f"B={b}, {n} tokens")
    ax1.axhline(base["tokens_per_s"], color=color, ls="--", lw=1)
    ax2.plot(xs, [r["tokens_per_kv_slot"] for r in ham], "o-", color=color, label=f"B={b}, {n}")
  ax1.set(xlabel="confidence", ylabel="decode tokens/s", title="HAMburger (solid) vs base (dashed)")
  ax2.axhline(1.0, color="gray", ls="--", lw=1)
  ax2.set(xlabel="confidence", ylabel="tokens per KV slot", title="tokens per base forward")
  ax1.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  return True


def measure(args) -> dict:
  """The whole `--engine sampler` run -> {"meta", "records"} (the table printed row by row)."""
  lengths, repeats = args.lengths, args.repeats
  if args.quick:
    lengths, repeats = [n for n in lengths if n <= 256] or [64], min(repeats, 2)
  cfg, params, weights = load_weights(args)
  print(f"{weights}; {param_count(params) / 1e6:.2f} M params; device {jax.devices()[0]}")
  print(HEADER)
  t0 = time.time()
  records = run_benchmark(cfg, params, args, lengths, repeats)
  meta = {"weights": weights, "params_m": param_count(params) / 1e6,
          "device": str(jax.devices()[0]), "backend": jax.default_backend(),
          "platform": platform.platform(), "prompt_len": args.prompt_len, "repeats": repeats,
          "config": cfg.to_dict(), "wall_s": time.time() - t0,
          "note": "greedy, no EOS; tokens/s excludes compile; loop_overhead = decode time / "
                  "(loop iterations x one base forward)"}
  return {"meta": meta, "records": records}
