"""The segmented examples as a TFDS dataset in array_record files (no TensorFlow needed).

Layout: `DATA_DIR/hamburger_sft/NAME/VERSION/` with `hamburger_sft-SPLIT.array_record-*` shards,
`dataset_info.json`, `features.json` and `metadata.json` (statistics and preparation settings).
Features, all int32: `tokens` [T + R] (prompt then response), `prompt_length` [], `steps` [k]
(group sizes, sum = R). Examples keep their order (shuffling is the input pipeline's job).

The builder class is not registered with TFDS, so readers need no import of this module:
`tfds.data_source("hamburger_sft/NAME:VERSION", data_dir=DATA_DIR)` reads the files directly.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.core.utils import tqdm_utils

BUILDER_NAME = "hamburger_sft"
DEFAULT_VERSION = "1.0.0"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

# A callable returning the split's examples (objects with .tokens, .prompt_length, .steps).
ExamplesFn = Callable[[], Iterable[Any]]


def features() -> tfds.features.FeaturesDict:
  return tfds.features.FeaturesDict({
      "tokens": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "prompt_length": tfds.features.Tensor(shape=(), dtype=np.int32),
      "steps": tfds.features.Tensor(shape=(None,), dtype=np.int32),
  })


class HamburgerSft(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Writes given splits of segmented examples (config name = dataset name)."""
  VERSION = tfds.core.Version(DEFAULT_VERSION)

  def __init__(self, *, splits: Mapping[str, ExamplesFn],
               metadata: Mapping[str, Any] | None = None, **kwargs):
    self._splits = dict(splits)
    self._metadata = dict(metadata or {})
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description="HAMburger training examples: tokens, prompt length, groups.",
        features=features(), disable_shuffling=True,
        metadata=tfds.core.MetadataDict(self._metadata))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(fn) for split, fn in self._splits.items()}

  def _generate_examples(self, examples_fn: ExamplesFn):
    for i, ex in enumerate(examples_fn()):
      yield i, {"tokens": np.asarray(ex.tokens, np.int32),
                "prompt_length": np.int32(ex.prompt_length),
                "steps": np.asarray(ex.steps, np.int32)}

  # TFDS's "Downloading and preparing .." lines would name the temporary directory: say nothing.
  def _log_download_bytes(self) -> None:
    pass

  def _log_download_done(self) -> None:
    pass


def _builder_class(config: tfds.core.BuilderConfig) -> type[HamburgerSft]:
  """HamburgerSft with `config` as its one known config (no 'custom configuration' warning)."""
  return type("HamburgerSft", (HamburgerSft,), {"BUILDER_CONFIGS": [config],
                                                  "__module__": __name__},
              skip_registration=True)


def check_name(name: str) -> None:
  if not _NAME_RE.match(name):
    raise ValueError(f"Dataset name {name!r}: use letters, digits, '_', '-' and '.' only.")


def dataset_dir(data_dir: str, name: str, version: str = DEFAULT_VERSION) -> str:
  """Where a prepared version lives."""
  return os.path.join(data_dir, BUILDER_NAME, name, version)


def dataset_exists(data_dir: str, name: str, version: str = DEFAULT_VERSION) -> bool:
  return os.path.isfile(os.path.join(dataset_dir(data_dir, name, version), "dataset_info.json"))


def write_dataset(splits: Mapping[str, ExamplesFn], data_dir: str, name: str,
                  version: str = DEFAULT_VERSION, metadata: Mapping[str, Any] | None = None,
                  overwrite: bool = False, progress: bool = True) -> str:
  """Writes the splits as array_record; returns the version directory.

  The files are written under a temporary directory and moved into place at the end, so a crash
  leaves any earlier version intact. An existing version is kept unless `overwrite`.
  """
  check_name(name)
  if progress:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    splits = {k: (lambda fn=fn, k=k: tqdm(fn(), desc=f"writing {k}", unit="ex"))
              for k, fn in splits.items()}
  final = dataset_dir(data_dir, name, version)
  if dataset_exists(data_dir, name, version) and not overwrite:
    return final
  tmp_root = os.path.join(data_dir, f".tmp-{name}-{version}")
  shutil.rmtree(tmp_root, ignore_errors=True)
  config = tfds.core.BuilderConfig(name=name, version=version)
  builder = _builder_class(config)(splits=splits, metadata=metadata, data_dir=tmp_root,
                                   config=name, file_format="array_record")
  was_on = getattr(tqdm_utils, "_active", True)
  tfds.disable_progress_bar()   # its bars name the temporary directory; ours is below
  try:
    # No network: never look for a copy of the dataset on GCS.
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  finally:
    tfds.display_progress_bar(was_on)
  built = dataset_dir(tmp_root, name, version)
  if os.path.isdir(final):
    shutil.rmtree(final)
  os.makedirs(os.path.dirname(final), exist_ok=True)
  os.replace(built, final)
  shutil.rmtree(tmp_root, ignore_errors=True)
  return final


def data_source(data_dir: str, name: str, version: str | None = None, split: str = "train"):
  """The random-access `tfds.data_source` of a prepared split (records: dicts of numpy)."""
  spec = f"{BUILDER_NAME}/{name}" + (f":{version}" if version else "")
  try:
    return tfds.data_source(spec, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # pylint: disable=broad-except
    raise FileNotFoundError(f"No prepared split {split!r} of {spec} under {data_dir} ({e}). Run "
                            "`python -m hamburger_jax.data.prepare` first.") from e


def read_info(data_dir: str, name: str, version: str | None = None) -> tfds.core.DatasetInfo:
  """DatasetInfo of a prepared dataset (splits, sizes, and `.metadata`)."""
  if version is None:
    root = os.path.join(data_dir, BUILDER_NAME, name)
    versions = sorted((v for v in os.listdir(root) if dataset_exists(data_dir, name, v)),
                      key=lambda v: tuple(int(x) for x in v.split(".")))
    if not versions:
      raise FileNotFoundError(f"No prepared version of {name} under {root}.")
    version = versions[-1]
  return tfds.builder_from_directory(dataset_dir(data_dir, name, version)).info
