"""Host-side logging: TensorBoard event files, a JSONL file, a tqdm progress bar.

    writer = MetricsWriter(workdir)       # writes only on process 0
    writer.write(step, {"train/loss": 1.2, ...})
    writer.close()

TensorBoard files are written with `tensorboardX` when it is installed (no TensorFlow needed);
without it only the JSONL file is written (`workdir/metrics.jsonl`, one {"step", ...} per line).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Mapping

import jax
import numpy as np

JSONL_FILE = "metrics.jsonl"


def _scalar(v) -> float:
  v = float(np.asarray(v))
  return v


class MetricsWriter:
  """Writes scalar metrics to `workdir/metrics.jsonl` and `workdir/tensorboard/` (process 0)."""

  def __init__(self, workdir: str, tensorboard: bool = True, enabled: bool | None = None,
               resume_step: int | None = None):
    """`resume_step`: rows of later steps (written before the run was cut short, and about to be
    written again) are dropped from the JSONL file."""
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self._tb = None
    self._jsonl = None
    if not self.enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    if resume_step is not None:
      _drop_rows_after(os.path.join(workdir, JSONL_FILE), resume_step)
    self._jsonl = open(os.path.join(workdir, JSONL_FILE), "a")
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter
        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
      except ImportError:
        logging.warning("tensorboardX is not installed: writing %s only.", JSONL_FILE)

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    values = {k: _scalar(v) for k, v in scalars.items()}
    row = {"step": int(step), "time": time.time()}
    row.update({k: (v if math.isfinite(v) else str(v)) for k, v in values.items()})
    self._jsonl.write(json.dumps(row) + "\n")
    self._jsonl.flush()
    if self._tb is not None:
      for k, v in values.items():
        self._tb.add_scalar(k, v, step)

  def flush(self) -> None:
    if self._tb is not None:
      self._tb.flush()
    if self._jsonl is not None:
      self._jsonl.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    if self._jsonl is not None:
      self._jsonl.close()
      self._jsonl = None


def _drop_rows_after(path: str, step: int) -> None:
  """Rewrites the JSONL file (atomically) without rows of steps > `step` or cut-short lines."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = f.read().splitlines()
  kept = []
  for line in lines:
    try:
      row = json.loads(line)
    except json.JSONDecodeError:     # a line cut short by a kill
      continue
    if isinstance(row, dict) and row.get("step", 0) <= step:
      kept.append(line)
  if len(kept) == len(lines):
    return
  with open(path + ".tmp", "w") as f:
    f.write("".join(line + "\n" for line in kept))
  os.replace(path + ".tmp", path)


def read_jsonl(workdir: str) -> list[dict]:
  """All rows of `workdir/metrics.jsonl` (later rows of a resumed run come after earlier ones)."""
  path = os.path.join(workdir, JSONL_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


class Progress:
  """A tqdm bar over training steps showing loss and tokens/s (process 0, optional)."""

  def __init__(self, total: int, initial: int, enabled: bool = True):
    self._bar = None
    if enabled and jax.process_index() == 0:
      from tqdm import tqdm
      self._bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                       mininterval=1.0)

  def update(self, step: int, **postfix) -> None:
    if self._bar is None:
      return
    self._bar.update(step - self._bar.n)
    if postfix:
      self._bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()}, refresh=False)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
