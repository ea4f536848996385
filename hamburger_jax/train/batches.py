"""Training batches: the data hook of the training loop (`train/loop.py`) (synthetic data, or the grain pipeline of
`hamburger_jax.data`), and the host -> device transfer.

    it = make_iterator(config, cfg, split="train")    # next(it) -> this process's rows (numpy)
    it.get_state() / it.set_state(state)              # JSON-able; saved with the train state
    arrays = to_device(next(it), data_sharding)       # global jax.Arrays [B, ...]

`data.source = "synthetic"`: patterned token examples (each example counts up from a random
start token with a stride of 1 or 2, so it is learnable) with random group sizes, deterministic from
(seed, split, batch index): the state is the number of batches consumed. `"tfds"`: a prepared
dataset read by `hamburger_jax.data.make_iterator` (imported lazily).
"""

from __future__ import annotations

import jax
import numpy as np

from hamburger_jax.model.batch import example_to_macro, pack_rows
from hamburger_jax.model.config import HamburgerConfig

SOURCES = ("synthetic", "tfds")
_FIRST_TOKEN = 3          # synthetic tokens avoid 0 (pad), 1 (BOS) and 2 (EOS)
_SPLIT_IDS = {"train": 0, "eval": 1}


def validate(config) -> None:
  """Raises ValueError for data settings that cannot work."""
  d = config.data
  if d.source not in SOURCES:
    raise ValueError(f"data.source {d.source!r} is unknown: use one of {SOURCES}.")
  if d.source == "tfds" and not (d.name and d.data_dir):
    raise ValueError("data.source='tfds' needs data.name and data.data_dir (a prepared dataset: "
                     "python -m hamburger_jax.data.prepare ...).")
  if d.source == "synthetic":
    (p_lo, p_hi), (r_lo, r_hi) = d.prompt_len, d.response_len
    if not (1 <= p_lo <= p_hi and 1 <= r_lo <= r_hi):
      raise ValueError(f"data.prompt_len {d.prompt_len} / response_len {d.response_len} must be "
                       "[lo, hi] ranges with 1 <= lo <= hi.")
    if p_hi + r_hi - 1 > d.seq_len:
      raise ValueError(f"Synthetic examples need up to {p_hi + r_hi - 1} macro positions but "
                       f"data.seq_len is {d.seq_len}: lower prompt_len/response_len.")


class SyntheticIterator:
  """Packed batches of patterned examples; deterministic and resumable (state = batches read)."""

  def __init__(self, cfg: HamburgerConfig, seq_len: int, rows: int, prompt_len, response_len,
               seed: int, split: str, group_size_one: bool, row_slice: slice):
    self.cfg, self.seq_len, self.rows = cfg, seq_len, rows
    self.prompt_len, self.response_len = tuple(prompt_len), tuple(response_len)
    self.seed, self.split_id = seed, _SPLIT_IDS[split]
    self.group_size_one, self.row_slice = group_size_one, row_slice
    self.batches = 0

  def _example(self, rng):
    vocab = self.cfg.base.vocab_size - _FIRST_TOKEN
    t = int(rng.integers(self.prompt_len[0], self.prompt_len[1] + 1))
    r = int(rng.integers(self.response_len[0], self.response_len[1] + 1))
    start, stride = rng.integers(0, vocab), rng.integers(1, 3)
    seq = _FIRST_TOKEN + (start + stride * np.arange(t + r - 1)) % vocab
    prompt = np.concatenate([[self.cfg.base.bos_token_id or 1], seq[:t - 1]])
    steps, left, s = [], r, 1 if self.group_size_one else self.cfg.max_steps
    while left:
      steps.append(int(rng.integers(1, min(s, left) + 1)))
      left -= steps[-1]
    return prompt, seq[t - 1:], steps

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    rng = np.random.default_rng((self.seed, self.split_id, self.batches))
    macros, rows = [], []
    for _ in range(self.rows):
      row, used = [], 0
      while True:
        macro = example_to_macro(*self._example(rng), self.cfg.max_steps)
        m = len(macro["group_lengths"])
        if used + m > self.seq_len:
          break
        row.append(len(macros))
        macros.append(macro)
        used += m
      rows.append(row)
    self.batches += 1
    batch = pack_rows(macros, rows, self.seq_len, self.cfg.max_steps, self.rows)
    return {k: v[self.row_slice] for k, v in batch.items()}

  def get_state(self) -> dict:
    return {"batches": self.batches}

  def set_state(self, state: dict) -> None:
    self.batches = int(state["batches"])


def _tfds_iterator(config, cfg: HamburgerConfig, split: str, local_rows: int):
  from hamburger_jax import data as data_lib  # lazy: grain/tfds only when used
  d = config.data
  pipe = data_lib.PipelineConfig(
      data_dir=d.data_dir, name=d.name, split=d.train_split if split == "train" else d.eval_split,
      seq_len=d.seq_len, num_rows=local_rows, max_steps=cfg.max_steps, seed=config.seed,
      shuffle=split == "train", num_epochs=None)
  return data_lib.make_iterator(pipe)


def make_iterator(config, cfg: HamburgerConfig, split: str, rows: int | None = None):
  """This process's batch iterator for split "train" or "eval" (`rows` global rows per batch)."""
  rows = rows or config.data.batch_size
  count, index = jax.process_count(), jax.process_index()
  local = rows // count
  if config.data.source == "tfds":
    return _tfds_iterator(config, cfg, split, local)
  return SyntheticIterator(cfg, config.data.seq_len, rows, config.data.prompt_len,
                           config.data.response_len, config.seed, split,
                           config.mode == "base_lm", slice(index * local, (index + 1) * local))


def check_batch(batch: dict[str, np.ndarray], mode: str, vocab_size: int) -> None:
  """Host-side sanity checks: token ids inside the vocabulary; plain LM training needs every
  group of size 1. DataError naming the problem."""
  from hamburger_jax.data.sources import DataError  # pylint: disable=g-import-not-at-top
  top = max(int(batch["group_tokens"].max(initial=0)), int(batch["target_tokens"].max(initial=0)))
  if top >= vocab_size:
    raise DataError(f"The data holds token id {top} but the model's vocabulary has {vocab_size} "
                    "ids: prepare the data with the model's tokenizer (or set model.vocab_size).")
  if mode == "base_lm" and int(batch["group_lengths"].max(initial=0)) > 1:
    raise DataError("mode 'base_lm' needs batches whose groups all have size 1 (plain LM data); "
                    "this batch has merged groups.")


def check_dataset(config, cfg: HamburgerConfig) -> None:
  """DataError before training when a prepared dataset's vocabulary exceeds the model's."""
  if config.data.source != "tfds":
    return
  from hamburger_jax.data import builder  # pylint: disable=g-import-not-at-top
  from hamburger_jax.data.sources import DataError  # pylint: disable=g-import-not-at-top
  try:
    info = builder.read_info(config.data.data_dir, config.data.name)
  except Exception as e:  # tfds raises several types for a missing or unreadable dataset
    raise DataError(f"Cannot read the prepared dataset {config.data.name!r} in "
                    f"{config.data.data_dir} ({type(e).__name__}: {e}): check data.name and "
                    "data.data_dir, or run python -m hamburger_jax.data.prepare.") from e
  vocab = int(info.metadata.get("vocab_size", 0) or 0)
  if vocab > cfg.base.vocab_size:
    raise DataError(f"Dataset {config.data.name!r} was tokenized with a vocabulary of {vocab} "
                    f"ids but the model has {cfg.base.vocab_size}: use the model's tokenizer or "
                    "a model with a larger vocabulary.")


def to_device(batch: dict[str, np.ndarray], sharding) -> dict[str, jax.Array]:
  """This process's rows -> global arrays sharded over the batch axes."""
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in batch.items()}
