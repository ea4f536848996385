"""The pieces of `recipes.accelerate`: data, starting weights, run config and sizing, a clean
stop at the deadline, export and manifest (the flow and the device commands: accelerate.py).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import signal
import threading
import time

from hamburger_jax.shipped.smollm2 import ASSET_DIR, SYSTEM_PROMPT

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "smollm2_v2_sft.jsonl.gz")
CONFIG = os.path.join(REPO, "configs", "smollm2_gpu.py")
MAX_LENGTH = 128 + 96 + 1           # prompt + answer tokens, as the recipe's prepare step
SHARD_BYTES = 16 * 2 ** 20
COPIED = ("draft_vocab.json",)      # files of the shipped asset that describe the data, not weights


_START = time.time()


def log(message: str) -> None:
  print(f"accelerate [{time.time() - _START:5.0f} s]: {message}", flush=True)


def read_manifest(asset_dir: str = ASSET_DIR) -> dict:
  with open(os.path.join(asset_dir, "manifest.json")) as f:
    return json.load(f)


def select_answers(data: str, lines: str, path: str) -> int:
  """Lines FIRST:END (1-based, END excluded; "" = all) of the distilled answers -> `path`."""
  first, _, end = lines.partition(":")
  first, end = int(first or 1), (int(end) if end else None)
  with gzip.open(data, "rt") if data.endswith(".gz") else open(data) as f:
    rows = f.readlines()[first - 1:None if end is None else end - 1]
  if not rows:
    raise ValueError(f"--lines {lines!r} selects no answer of {data}.")
  with open(path, "w") as f:
    f.writelines(rows)
  return len(rows)


def prepare_data(workdir: str, base, lines: str, eval_examples: int, data: str = DATA) -> dict:
  """Tokenises and segments the chosen answers (the shipped manifest's segmentation), holding
  `eval_examples` out as split "validation"; -> the dataset's statistics."""
  import jax
  from hamburger_jax.data import builder, prepare
  from hamburger_jax.data.sources import SourceConfig
  from hamburger_jax.data.strategies import SegmentationConfig
  from hamburger_jax.data.tokenize import TokenizeConfig
  from hamburger_jax.shipped.smollm2 import write_tokenizer
  name = "smollm2_accelerate"
  answers = os.path.join(workdir, "answers.jsonl")
  count = select_answers(data, lines, answers)
  seg = read_manifest()["training"]["data"]["segmentation"]
  cfg = prepare.PrepareConfig(
      source=SourceConfig(inputs=answers),
      tokenize=TokenizeConfig(tokenizer_path=write_tokenizer(workdir), template="chatml",
                              system_prompt=SYSTEM_PROMPT, max_length=MAX_LENGTH),
      segmentation=SegmentationConfig(**seg), data_dir=os.path.join(workdir, "data"), name=name,
      eval_examples=eval_examples, model_id=f"smollm2 lines {lines}",
      tokens_per_batch=65536 if jax.default_backend() == "gpu" else 8192)
  result = prepare.prepare_dataset(cfg, base, progress=False)
  splits = builder.read_info(cfg.data_dir, name).splits
  stats = dict(result.stats, answers=count, lines=lines,
               split_examples={k: v.num_examples for k, v in splits.items()}, segmentation=seg)
  log(f"data: {count} answers, {stats['tokens_per_group']:.3f} tokens per group, "
      f"{stats['split_examples']} examples per split ({result.seconds:.0f} s)")
  return stats


def write_init(workdir: str, base_params) -> str:
  """The shipped grafted weights on the base, as one full export: the run's init.checkpoint."""
  from hamburger_jax.convert.native import is_hamburger_dir, load_hamburger, save_hamburger
  out = os.path.join(workdir, "init")
  if not is_hamburger_dir(out):
    cfg, params = load_hamburger(ASSET_DIR, base_params=base_params)
    save_hamburger(out + ".tmp", cfg, params)
    os.replace(out + ".tmp", out)
  return out


def make_config(args, workdir: str, init: str):
  """configs/smollm2_gpu.py (or --config) with this run's data, init, batch and sizes."""
  from hamburger_jax.train.run_config import load_config_file
  c = load_config_file(args.config)
  c.init.checkpoint = init
  c.data.data_dir = os.path.join(workdir, "data")
  c.data.name = "smollm2_accelerate"
  c.data.batch_size, c.data.seq_len = args.batch_size, args.seq_len
  c.model.max_targets = min(c.model.max_targets, args.seq_len)
  c.checkpoint.export = False                    # export() writes the grafted weights
  return c


def steps_per_epoch(stats: dict, seq_len: int, batch_size: int) -> int:
  """Optimizer steps for one pass over the training split (rows packed full)."""
  share = stats["split_examples"].get("train", 0) / max(1, stats["examples"])
  positions = (stats["prompt_tokens"] + stats["groups"]) * share
  return max(1, math.ceil(positions / seq_len / batch_size))


def fit_steps(seconds: float, step_s: float, cap: int) -> int:
  """Steps that fit in `seconds` at `step_s` each, at most `cap` (>= 1)."""
  return max(1, min(cap, int(seconds // max(step_s, 1e-9))))


def set_cadence(config, steps: int, stats: dict) -> None:
  """num_train_steps, and a checkpoint a quarter of the way each time; eval covers the split."""
  config.num_train_steps = steps
  config.checkpoint.every_steps = steps // 4 if steps >= 4 else steps
  config.logging.every_steps = max(1, min(config.logging.every_steps, steps // 4 or 1))
  rows = config.data.batch_size // config.optim.grad_accum_steps
  held = stats["split_examples"].get("validation", 0) / max(1, stats["examples"])
  positions = (stats["prompt_tokens"] + stats["groups"]) * held
  config.eval.num_batches = max(1, math.ceil(positions / config.data.seq_len / rows))


def machine() -> dict:
  import platform
  import jax
  d = jax.devices()[0]
  return {"device": f"{jax.device_count()} x {d.device_kind}", "platform": d.platform,
          "cpus": os.cpu_count(), "host": platform.node(), "jax": jax.__version__,
          "python": platform.python_version()}


class Watchdog:
  """SIGTERM to this process at `when` (the loop saves and stops on it); a signal that comes
  once training has stopped is ignored."""

  def __init__(self, when: float):
    self.fired = False
    self._prev = signal.signal(signal.SIGTERM, lambda *_: None)
    self._timer = threading.Timer(max(0.0, when - time.time()), self._fire)
    self._timer.daemon = True
    self._timer.start()

  def _fire(self) -> None:
    self.fired = True
    os.kill(os.getpid(), signal.SIGTERM)

  def close(self) -> None:
    self._timer.cancel()
    signal.signal(signal.SIGTERM, self._prev)


def train(config, workdir: str, stop_at: float):
  """train.loop.train_and_evaluate in workdir/train, stopped cleanly at `stop_at` (then the
  saved step is taken as the last); -> (the final TrainState, whether time ran out)."""
  from hamburger_jax.train.loop import train_and_evaluate
  from hamburger_jax.train.signals import Interrupted
  run_dir = os.path.join(workdir, "train")
  watchdog = Watchdog(stop_at)
  try:
    return train_and_evaluate(config, run_dir), False
  except Interrupted as e:
    if not (watchdog.fired and e.saved):
      raise
    log(f"time is up at step {e.step} of {config.num_train_steps}: stopped there")
    config.num_train_steps = e.step               # resume the saved step, run none
  finally:
    watchdog.close()
  return train_and_evaluate(config, run_dir), True


def export(out: str, cfg, params, record: dict) -> list[str]:
  """Grafted params (bf16) as shards of at most SHARD_BYTES, config, manifest -> `out`."""
  import shutil
  import jax
  import numpy as np
  from hamburger_jax.convert.native import CONFIG_FILE, flatten
  from hamburger_jax.convert.shards import write_shards
  from hamburger_jax.train.checkpoints import to_host
  grafted = {k: v for k, v in to_host(params).items() if k != "base"}
  flat = {k: np.asarray(jax.numpy.asarray(v, jax.numpy.bfloat16))
          for k, v in flatten(grafted).items()}
  paths = write_shards(out, flat, SHARD_BYTES,
                       {"format": "hamburger_jax", "subset": ",".join(sorted(grafted))})
  with open(os.path.join(out, CONFIG_FILE), "w") as f:
    json.dump(cfg.to_dict(), f, indent=2)
  for name in COPIED:
    shutil.copy(os.path.join(ASSET_DIR, name), out)
  with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(record, f, indent=2)
  return paths


def manifest(run: dict, stats: dict, config, metrics: dict) -> dict:
  """The shipped manifest's base and decoding entries + how these weights were made."""
  shipped = read_manifest()
  out = {k: v for k, v in shipped.items() if k not in ("training", "verify_drafter")}
  data = {k: stats[k] for k in ("answers", "lines", "examples", "response_tokens",
                                "tokens_per_group", "split_examples", "segmentation")}
  history = shipped["training"].get("history", "")
  out["training"] = dict(
      run, data=data, init_checkpoint="the shipped weights (hamburger_jax/assets/smollm2_hamburger)",
      freeze_base=bool(config.freeze_base), num_micro_layers=config.model.num_micro_layers,
      batch_size=config.data.batch_size, seq_len=config.data.seq_len,
      merge_adapter_rank=config.model.merge_adapter_rank, grafted_lr=config.optim.grafted_lr,
      end_lr=config.optim.end_lr, stop_target=config.loss.stop_target, held_out=metrics,
      history=(history + " Then, from those weights: " if history else "") +
      f"{run['train_steps']} steps of batch {config.data.batch_size} on one "
      f"{run['machine']['device']} ({run['minutes']:.1f} minutes, recipes.accelerate).")
  return out
