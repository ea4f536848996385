"""Decode speed: plain base-model decoding vs HAMburger, same prompts, same weights, one run.

    python benchmarks/decode_speed.py                                  # tiny random weights
    python benchmarks/decode_speed.py --quick                          # a few minutes on a CPU
    python benchmarks/decode_speed.py --preset small --batch_sizes 1,8 --lengths 64,256,1024
    python benchmarks/decode_speed.py --ckpt /path/to/export_dir       # real weights

For every batch size and output length: plain decoding (one token per base forward) and HAMburger
at each confidence, greedy, no EOS (outputs have exactly the requested length). Reported:
decode tokens/s (compile excluded), tokens per KV slot (= tokens per base forward), KV slots used
vs plain decoding's, and the loop overhead: the decode loop's time divided by (loop iterations x
the time of ONE compiled base forward of a single input per row at the same cache size). For
HAMburger that ratio also holds the micro-decoder steps.

Random weights (no --ckpt) say nothing about quality or about a trained model's group lengths.
Their stop decisions are made realistic this way: every matrix is drawn with std 0.08
(hamburger_jax.testing.fixtures.random_params), then the stop head's last layer (kernel scale and bias)
is set so that the stop logits seen while decoding the benchmark's own prompts (all rows of the
largest batch) have mean --stop_mean and std --stop_std (two passes: decoding with full groups,
then at confidence 0.8). Continue-probabilities then spread over (0, 1) and groups get 1..4
tokens depending on the confidence. Random weights also repeat tokens, and how long the groups
get differs a lot from prompt to prompt: the table reports what happened, row by row.
In a batch, the loop runs until its slowest row is done (static batching).
Writes <out_dir>/decode_speed.json and, with matplotlib installed, decode_speed.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time

import jax
import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report import positive_ints  # noqa: E402  pylint: disable=import-error

from hamburger_jax.model.config import BASE_PRESETS, HamburgerConfig, get_preset  # noqa: E402
from hamburger_jax.convert import load_model  # noqa: E402
from hamburger_jax.testing.fixtures import random_params, rescale_stop_head  # noqa: E402
from hamburger_jax.model.hamburger import param_count  # noqa: E402
from hamburger_jax.decode.sampler import Sampler  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "tiny", "model size for random weights: a config preset or 'small'")
flags.DEFINE_string("ckpt", None, "benchmark these weights instead (any decode.py checkpoint)")
flags.DEFINE_string("base_config", None, "base config.json for an original checkpoint")
flags.DEFINE_string("batch_sizes", "1,8", "comma-separated batch sizes")
flags.DEFINE_string("confidences", "0.5,0.7,0.8,0.9,1.0", "comma-separated confidences")
flags.DEFINE_string("lengths", "64,256,1024", "comma-separated output lengths (new tokens)")
flags.DEFINE_integer("prompt_len", 32, "prompt tokens per row (random ids)")
flags.DEFINE_integer("repeats", 3, "timed runs per setting (the fastest counts)")
flags.DEFINE_integer("forward_repeats", 50, "timed calls of the single base forward")
flags.DEFINE_float("stop_mean", -1.0, "random weights: mean stop logit on random groups")
flags.DEFINE_float("stop_std", 2.0, "random weights: std of stop logits on random groups")
flags.DEFINE_integer("seed", 0, "weights and prompts seed")
flags.DEFINE_string("out_dir", "benchmarks/results", "where the JSON and PNG go")
flags.DEFINE_bool("quick", False, "shrink to batch 1,8, lengths 64,256, 2 repeats")

# 'small': a few million parameters, wide enough that the matmuls dominate on a CPU.
SMALL = HamburgerConfig(
    base=dataclasses.replace(BASE_PRESETS["tiny"], vocab_size=4096, hidden_size=256,
                             intermediate_size=768, num_layers=8, num_heads=8, num_kv_heads=2,
                             head_dim=32),
    feature_layers=(1, 3, 5))



def _confidences(s):
  return [float(x) for x in s.split(",") if x.strip()]


def _valid(parse, check=lambda values: True):
  """-> an absl flag validator: True when `parse` takes the text and `check` holds."""
  def validate(text):
    try:
      return check(parse(text))
    except (ValueError, argparse.ArgumentTypeError):
      return False
  return validate


flags.register_validator("batch_sizes", _valid(positive_ints), "a comma-separated list of positive "
                         "integers is needed, e.g. --batch_sizes=1,8")
flags.register_validator("lengths", _valid(positive_ints), "a comma-separated list of positive "
                         "integers is needed, e.g. --lengths=64,256")
flags.register_validator("confidences",
                         _valid(_confidences, lambda v: bool(v) and all(0 < c <= 1 for c in v)),
                         "comma-separated confidences in (0, 1] are needed, e.g. "
                         "--confidences=0.5,0.8")


def load_weights():
  """-> (cfg, params, description). Random weights unless --ckpt."""
  if FLAGS.ckpt:
    kind, cfg, params = load_model(FLAGS.ckpt, base_config=FLAGS.base_config)
    if kind != "hamburger":
      raise app.UsageError(f"{FLAGS.ckpt} is a plain Llama: HAMburger weights are needed.")
    return cfg, params, f"checkpoint {FLAGS.ckpt}"
  cfg = SMALL if FLAGS.preset == "small" else get_preset(FLAGS.preset)
  params = random_params(cfg, FLAGS.seed, stop_mean=FLAGS.stop_mean, stop_std=FLAGS.stop_std)
  params = calibrate_on_decoding(cfg, params)
  return cfg, params, (f"random weights, preset {FLAGS.preset}, stop logits set to mean "
                       f"{FLAGS.stop_mean} / std {FLAGS.stop_std} while decoding (no quality "
                       "meaning)")


def benchmark_prompts(vocab_size: int, rows: int):
  """The same random prompts for every setting: batch b decodes the first b."""
  rng = np.random.default_rng(FLAGS.seed)
  return rng.integers(3, vocab_size, (rows, FLAGS.prompt_len)).tolist()


def calibrate_on_decoding(cfg, params, new_tokens: int = 64):
  """Rescales the stop head on the stop logits met while decoding the prompts (see top)."""
  prompts = benchmark_prompts(cfg.base.vocab_size, max(positive_ints(FLAGS.batch_sizes)))
  for confidence in (1e-6, 0.8):
    sampler = Sampler(cfg, params, cache_length=-(-(FLAGS.prompt_len + new_tokens) // 64) * 64,
                      out_length=new_tokens)
    r = sampler.decode(prompts, max_new_tokens=new_tokens, confidence=confidence, eos_ids=[])
    params = rescale_stop_head(params, np.concatenate(r.stop_logits), FLAGS.stop_mean,
                               FLAGS.stop_std)
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


def forward_seconds(sampler, prompts):
  """One compiled base forward of a single input per row at the sampler's cache size."""
  state, _ = sampler.start(prompts, max_new_tokens=1)
  return sampler.time_forward(state, FLAGS.forward_repeats)


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


def run_benchmark(cfg, params, batch_sizes, lengths, confidences, repeats):
  all_prompts = benchmark_prompts(cfg.base.vocab_size, max(batch_sizes))
  records = []
  for b in batch_sizes:
    prompts = all_prompts[:b]
    for n in lengths:
      size = dict(cache_length=-(-(FLAGS.prompt_len + n) // 64) * 64, out_length=n)
      base = Sampler(cfg, params, base=True, **size)
      ham = Sampler(cfg, params, **size)
      r, c = time_setting(base, prompts, n, repeats)
      records.append(record("base", b, n, None, r, c, forward_seconds(base, prompts)))
      print(_row(records[-1], records[-1]), flush=True)
      fwd = forward_seconds(ham, prompts)
      for conf in confidences:
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
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
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


def main(argv):
  del argv
  batch_sizes, lengths = positive_ints(FLAGS.batch_sizes), positive_ints(FLAGS.lengths)
  confidences = _confidences(FLAGS.confidences)
  repeats = FLAGS.repeats
  if FLAGS.quick:
    lengths, repeats = [n for n in lengths if n <= 256] or [64], min(repeats, 2)
  cfg, params, weights = load_weights()
  print(f"{weights}; {param_count(params) / 1e6:.2f} M params; device {jax.devices()[0]}")
  print(HEADER)
  t0 = time.time()
  records = run_benchmark(cfg, params, batch_sizes, lengths, confidences, repeats)
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  meta = {"weights": weights, "params_m": param_count(params) / 1e6,
          "device": str(jax.devices()[0]), "backend": jax.default_backend(),
          "platform": platform.platform(), "prompt_len": FLAGS.prompt_len, "repeats": repeats,
          "config": cfg.to_dict(), "wall_s": time.time() - t0,
          "note": "greedy, no EOS; tokens/s excludes compile; loop_overhead = decode time / "
                  "(loop iterations x one base forward)"}
  json_path = os.path.join(FLAGS.out_dir, "decode_speed.json")
  with open(json_path, "w") as f:
    json.dump({"meta": meta, "records": records}, f, indent=1)
  png_path = os.path.join(FLAGS.out_dir, "decode_speed.png")
  print(f"wrote {json_path}" + (f" and {png_path}" if plot(records, png_path) else ""))


if __name__ == "__main__":
  app.run(main)
