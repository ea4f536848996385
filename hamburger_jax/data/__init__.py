"""Training data for HAMburger: sources, tokenization, entropy segmentation, TFDS, grain.

Preparing (once):    `python -m hamburger_jax.data.prepare ...`
                     or `prepare_dataset(PrepareConfig(...), model=(llama_cfg, params))`.
Training (per step): `it = make_iterator(PipelineConfig(...)); batch = next(it)`;
                     `save_iterator(it, dir)` / `restore_iterator(it, dir)` with the checkpoint.
"""

from hamburger_jax.data.builder import (data_source, dataset_dir, dataset_exists, read_info,
                                        write_dataset)
from hamburger_jax.data.distill import self_distill
from hamburger_jax.data.pipeline import (PipelineConfig, batch_spec, make_dataset, make_iterator,
                                         restore_iterator, save_iterator)
from hamburger_jax.data.segmentation import Scorer, SegmentedExample, segment_examples
from hamburger_jax.data.sources import DataError, RawExample, SourceConfig, read_examples
from hamburger_jax.data.stats import SegmentStats
from hamburger_jax.data.strategies import SegmentationConfig, entropy_threshold, group_sizes
from hamburger_jax.data.tokenize import (ChatTokenizer, TokenizeConfig, TokenizedExample,
                                         tokenize_examples)


def __getattr__(name):
  # `prepare` is also a `python -m` entry point: import it only when asked for.
  if name in ("PrepareConfig", "PrepareResult", "prepare_dataset"):
    from hamburger_jax.data import prepare  # pylint: disable=g-import-not-at-top
    return getattr(prepare, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
