"""grain input pipeline: prepared examples -> packed, static-shape training batches (batch.py).

    it = make_iterator(PipelineConfig(data_dir, name, seq_len=2048, num_rows=8, max_steps=4))
    batch = next(it)                 # dict of int32 numpy: the fields of batch.BATCH_FIELDS,
                                     # [num_rows, seq_len] or [num_rows, seq_len, max_steps]
    save_iterator(it, ckpt_dir)      # orbax + grain; restore_iterator(fresh_it, ckpt_dir)

Order of operations: source (`tfds.data_source`) -> this host's shard (`[index::count]`, so hosts
see disjoint examples) -> seeded global shuffle (a new order every epoch) -> repeat -> to macro
arrays (`batch.example_to_macro`; examples longer than seq_len are truncated by whole groups or
dropped, counted in `pack_stats`; a repeating pipeline that drops a whole epoch in a row raises
DataError naming the seq_len needed) -> greedy first-fit packing of consecutive examples into `num_rows` rows, a batch being
emitted when the next example fits in no row (`batch.pack_rows`). The iterator state (a few
integers) is saved with orbax through grain's checkpoint handler; restoring it in a freshly built
pipeline replays exactly the batches an uninterrupted run would have produced.

With orbax's CheckpointManager, save it next to the train state:
`ocp.args.Composite(state=..., data=grain.checkpoint.CheckpointSave(it))` and restore with
`grain.checkpoint.CheckpointRestore(it)`.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Sequence

import grain
import numpy as np

from hamburger_jax.model.batch import BATCH_FIELDS, example_to_macro, pack_rows
from hamburger_jax.data import builder
from hamburger_jax.data.sources import DataError


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  """Which prepared dataset to read and the static batch shape (per host)."""
  data_dir: str
  name: str
  version: str | None = None       # None: the newest prepared version
  split: str = "train"
  seq_len: int = 2048              # M: macro positions per row
  num_rows: int = 8                # B: rows per batch on this host
  max_steps: int = 4               # S
  seed: int = 0
  shuffle: bool = True
  num_epochs: int | None = 1       # None: repeat forever
  overlong: str = "truncate"       # truncate (drop trailing groups) | drop
  drop_remainder: bool = False     # drop the last, partly filled batch of a finite run
  even_shards: bool = True         # every host gets len // count examples (drops < count)
  read_threads: int = 4

  def __post_init__(self):
    if self.overlong not in ("truncate", "drop"):
      raise ValueError(f"overlong must be 'truncate' or 'drop', got {self.overlong!r}.")
    if self.seq_len < 2 or self.num_rows < 1:
      raise ValueError("seq_len must be >= 2 and num_rows >= 1.")


def fit_example(tokens: np.ndarray, prompt_length: int, steps: np.ndarray, seq_len: int,
                overlong: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
  """(prompt, response, steps) fitted to seq_len macro positions, or None to drop it."""
  t, n = int(prompt_length), len(steps)
  prompt, response = tokens[:t], tokens[t:]
  if t + n - 1 <= seq_len:
    return prompt, response, steps
  keep = seq_len - t + 1          # groups that fit: T + keep - 1 <= seq_len
  if overlong == "drop" or keep < 1:
    return None
  steps = steps[:keep]
  return prompt, response[:int(np.sum(steps))], steps


class PackStats:
  """Counts of this pipeline's packing (not part of the checkpointed state)."""

  def __init__(self):
    self.examples = self.dropped = self.truncated = self.batches = 0
    self.used_positions = self.total_positions = 0

  @property
  def fill(self) -> float:
    """Fraction of macro positions holding data."""
    return self.used_positions / self.total_positions if self.total_positions else 0.0


class _ToMacro:
  """Record of the data source -> unpacked macro arrays (or a {'skip': reason} marker)."""

  def __init__(self, seq_len: int, max_steps: int, overlong: str):
    self.seq_len, self.max_steps, self.overlong = seq_len, max_steps, overlong

  def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
    if any(record.get(k) is None for k in ("tokens", "prompt_length", "steps")):
      raise DataError("A record of the prepared dataset is unreadable (damaged files): rebuild it "
                      "with python -m hamburger_jax.data.prepare ... --overwrite.")
    tokens = np.asarray(record["tokens"], np.int32)
    steps = np.asarray(record["steps"], np.int32)
    if steps.size and steps.max() > self.max_steps:
      raise ValueError(f"A stored group has {steps.max()} tokens but max_steps is "
                       f"{self.max_steps}: prepare the data with --max_steps {self.max_steps}.")
    fitted = fit_example(tokens, int(record["prompt_length"]), steps, self.seq_len, self.overlong)
    if fitted is None:
      return {"skip": "dropped", "needs": int(record["prompt_length"]) + len(steps) - 1}
    macro = example_to_macro(*fitted, self.max_steps)
    if len(fitted[2]) < len(steps):
      macro["truncated"] = True
    return macro


class _PackIterator(grain.DatasetIterator):
  """Greedy first-fit of consecutive examples into static batches; state = the parent's."""

  def __init__(self, parent: grain.DatasetIterator, seq_len: int, num_rows: int, max_steps: int,
               drop_remainder: bool, stats: PackStats, epoch_size: int | None):
    super().__init__(parent)
    self._seq_len, self._num_rows, self._max_steps = seq_len, num_rows, max_steps
    self._drop_remainder = drop_remainder
    self._stats = stats
    self._epoch_size = epoch_size      # a whole epoch dropped in a row: no example can ever fit
    self._drops_in_a_row, self._shortest_dropped = 0, None
    self._pending = None   # (macro, parent state before it was read): did not fit last batch

  @property
  def pack_stats(self) -> PackStats:
    """Examples packed, dropped and truncated so far (also logged by the training loop)."""
    return self._stats

  def _dropped(self, needs: int) -> None:
    self._stats.dropped += 1
    self._drops_in_a_row += 1
    self._shortest_dropped = min(needs, self._shortest_dropped or needs)
    if self._epoch_size and self._drops_in_a_row >= self._epoch_size:
      raise DataError(
          f"Every one of the {self._epoch_size} examples is dropped by the packer: the shortest "
          f"prompt needs {self._shortest_dropped} macro positions but seq_len is {self._seq_len}. "
          f"Raise data.seq_len to at least {self._shortest_dropped} (or prepare shorter "
          "examples with --max_length).")

  def _emit(self, macros, rows) -> dict[str, np.ndarray]:
    batch = pack_rows(macros, rows, self._seq_len, self._max_steps, self._num_rows)
    self._stats.batches += 1
    self._stats.used_positions += int(np.count_nonzero(batch["segment_ids"]))
    self._stats.total_positions += batch["segment_ids"].size
    return batch

  def __next__(self) -> dict[str, np.ndarray]:
    macros, rows, free = [], [], []
    while True:
      if self._pending is not None:
        (macro, state_before), self._pending = self._pending, None
      else:
        state_before = copy.deepcopy(self._parent.get_state())
        try:
          macro = next(self._parent)
        except StopIteration:
          if macros and not self._drop_remainder:
            return self._emit(macros, rows)
          raise
        if "skip" in macro:
          self._dropped(macro.get("needs", 0))
          continue
        self._drops_in_a_row = 0
        self._stats.examples += 1
        self._stats.truncated += int(macro.pop("truncated", False))
      m = len(macro["group_lengths"])
      row = next((r for r, room in enumerate(free) if m <= room), None)
      if row is None and len(rows) < self._num_rows:
        rows.append([])
        free.append(self._seq_len)
        row = len(rows) - 1
      if row is None:
        self._pending = (macro, state_before)
        return self._emit(macros, rows)
      rows[row].append(len(macros))
      macros.append(macro)
      free[row] -= m

  def get_state(self) -> dict[str, Any]:
    if self._pending is not None:
      return {"parent": copy.deepcopy(self._pending[1])}
    return {"parent": self._parent.get_state()}

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state["parent"])
    self._pending = None

  def __str__(self) -> str:
    return f"PackIterator(seq_len={self._seq_len}, num_rows={self._num_rows})"


class PackIterDataset(grain.IterDataset):
  """IterDataset of macro examples -> IterDataset of packed batches (see _PackIterator)."""

  def __init__(self, parent: grain.IterDataset, seq_len: int, num_rows: int, max_steps: int,
               drop_remainder: bool = False, epoch_size: int | None = None):
    """`epoch_size`: examples per epoch; that many dropped in a row is a DataError (none fits)."""
    super().__init__(parent)
    self._args = (seq_len, num_rows, max_steps, drop_remainder)
    self._epoch_size = epoch_size
    self.stats = PackStats()

  def __iter__(self) -> _PackIterator:
    return _PackIterator(self._parent.__iter__(), *self._args, self.stats, self._epoch_size)

  def __str__(self) -> str:
    return f"PackIterDataset(seq_len={self._args[0]}, num_rows={self._args[1]})"


def _host(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} is outside 0..{process_count - 1}.")
  return process_index, process_count


def host_examples(cfg: PipelineConfig, source: Sequence[Any] | None = None,
                  process_index: int | None = None,
                  process_count: int | None = None) -> grain.MapDataset:
  """This host's shard of the records, shuffled (per epoch) and repeated, as a MapDataset."""
  ds = _host_shard(cfg, source, process_index, process_count)
  if cfg.shuffle:
    ds = ds.shuffle(seed=cfg.seed)
  return ds.repeat(cfg.num_epochs)


def _host_shard(cfg: PipelineConfig, source, process_index, process_count) -> grain.MapDataset:
  index, count = _host(process_index, process_count)
  if source is None:
    source = builder.data_source(cfg.data_dir, cfg.name, cfg.version, cfg.split)
  ds = grain.MapDataset.source(source)
  total = len(ds) - (len(ds) % count if cfg.even_shards else 0)
  ds = ds[index:total:count]
  if len(ds) == 0:
    raise ValueError(f"Host {index} of {count} gets no examples from a split of {len(source)}.")
  return ds


def make_dataset(cfg: PipelineConfig, source: Sequence[Any] | None = None,
                 process_index: int | None = None,
                 process_count: int | None = None) -> PackIterDataset:
  """The packed-batch IterDataset for this host (process index/count default to jax's)."""
  ds = _host_shard(cfg, source, process_index, process_count)
  epoch_size = len(ds) if cfg.num_epochs is None else None   # a finite run ends by itself
  if cfg.shuffle:
    ds = ds.shuffle(seed=cfg.seed)
  ds = ds.repeat(cfg.num_epochs).map(_ToMacro(cfg.seq_len, cfg.max_steps, cfg.overlong))
  ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=cfg.read_threads,
                                            prefetch_buffer_size=max(16, 4 * cfg.num_rows)))
  return PackIterDataset(ds, cfg.seq_len, cfg.num_rows, cfg.max_steps, cfg.drop_remainder,
                         epoch_size)


def make_iterator(cfg: PipelineConfig, source: Sequence[Any] | None = None,
                  process_index: int | None = None,
                  process_count: int | None = None) -> grain.DatasetIterator:
  """An iterator of batches (dicts of int32 numpy, the fields of batch.BATCH_FIELDS)."""
  return iter(make_dataset(cfg, source, process_index, process_count))


def save_iterator(iterator: grain.DatasetIterator, directory: str) -> None:
  """Saves the iterator state (orbax checkpoint with grain's handler) into a new `directory`."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  with ocp.Checkpointer(grain.checkpoint.CheckpointHandler()) as ckpt:
    ckpt.save(directory, args=grain.checkpoint.CheckpointSave(iterator), force=True)


def restore_iterator(iterator: grain.DatasetIterator, directory: str) -> grain.DatasetIterator:
  """Restores a state saved by `save_iterator` into `iterator` (built with the same config)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  with ocp.Checkpointer(grain.checkpoint.CheckpointHandler()) as ckpt:
    return ckpt.restore(directory, args=grain.checkpoint.CheckpointRestore(iterator))


def batch_spec(cfg: PipelineConfig) -> dict[str, tuple[int, ...]]:
  """Static shapes of the batch fields (all int32)."""
  b, m, s = cfg.num_rows, cfg.seq_len, cfg.max_steps
  return {k: (b, m, s) if k in ("group_tokens", "target_tokens") else (b, m) for k in BATCH_FIELDS}
