"""Prepare a segmented dataset: read -> tokenize -> (self-distil) -> segment -> TFDS array_record.

    python -m hamburger_jax.data.prepare --inputs data/sft.jsonl --tokenizer tokenizer.json \\
        --model random:tiny --data_dir ~/hamburger_data --name my_sft [--strategy decreasing_v2]

    python -m hamburger_jax.data.prepare --mode lm --inputs corpus/ --tokenizer tokenizer.json \\
        --data_dir ~/hamburger_data --name my_corpus        # plain LM data: no model needed

Every input record is read and tokenized before the model runs, so bad input fails fast (or is
counted with --on_error=skip). Segmented chunks are saved as they complete (a re-run resumes) and
the dataset is moved into place only once complete. Re-running is a no-op when the version exists
(--overwrite rebuilds it). `--model` is `random:PRESET` (random weights, for tests and timing) or
`MODULE:FUNCTION`, a loader called with --model_path that returns (LlamaConfig, params).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib
import sys
import time
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from hamburger_jax.data import builder, distill
from hamburger_jax.data.chunks import ChunkStore, fingerprint
from hamburger_jax.data.segmentation import segment_examples, unit_segments
from hamburger_jax.model.scoring import Scorer
from hamburger_jax.data.sources import DataError, SourceConfig, read_examples
from hamburger_jax.data.stats import SegmentStats
from hamburger_jax.data.strategies import SegmentationConfig
from hamburger_jax.data.tokenize import ChatTokenizer, TokenizeConfig, tokenize_examples


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
  """Everything `prepare_dataset` needs besides the model."""
  source: SourceConfig
  tokenize: TokenizeConfig
  segmentation: SegmentationConfig
  data_dir: str
  name: str
  version: str = builder.DEFAULT_VERSION
  overwrite: bool = False
  eval_examples: int = 0          # held out (seeded choice) as split "validation"
  seed: int = 0
  chunk_size: int = 2048          # examples per saved segmentation chunk
  tokens_per_batch: int = 8192    # segmentation batch budget (rows x bucket length)
  distill_batch_size: int = 32
  model_id: str = ""              # names the model in the resume fingerprint

  def __post_init__(self):
    if self.source.mode != self.tokenize.mode:
      raise ValueError(f"source.mode {self.source.mode!r} and tokenize.mode "
                       f"{self.tokenize.mode!r} differ: set both to 'sft' or both to 'lm'.")
    for name, low in (("eval_examples", 0), ("seed", 0), ("chunk_size", 1),
                      ("tokens_per_batch", 1), ("distill_batch_size", 1)):
      if getattr(self, name) < low:
        raise ValueError(f"{name} (--{name}) must be >= {low}, got {getattr(self, name)}.")


class PrepareResult(NamedTuple):
  path: str
  stats: dict[str, Any]           # SegmentStats.to_dict() over all splits
  counters: dict[str, int]        # records read, skips, truncations, ..
  seconds: float
  skipped: bool                   # the version existed and was kept


def _load_examples(cfg: PrepareConfig, tok: ChatTokenizer, counters):
  examples = list(tokenize_examples(read_examples(cfg.source, counters), tok, counters,
                                    cfg.source.on_error))
  if not examples:
    raise DataError(f"No examples left from {cfg.source.inputs!r} after filtering "
                    f"({dict(counters)}): check the field names and max_length.")
  return examples


def _check_vocab(examples, vocab_limit: int | None) -> None:
  if vocab_limit is not None:
    top = max(int(max(ex.prompt.max(), ex.response.max())) for ex in examples)
    if top >= vocab_limit:
      raise DataError(f"Token id {top} is outside the model's vocabulary ({vocab_limit}): the "
                      "tokenizer does not belong to this model.")


def _check_record(r, where: str) -> None:
  """ValueError unless `r` is a whole example: tokens, prompt_length and steps that add up."""
  tokens, plen, steps = (r.get(k) if isinstance(r, dict) else None
                         for k in ("tokens", "prompt_length", "steps"))
  if tokens is None or plen is None or steps is None:
    raise ValueError(f"{where} is empty or unreadable")
  if not 1 <= int(plen) < len(tokens) or int(np.sum(steps)) != len(tokens) - int(plen):
    raise ValueError(f"{where} is inconsistent (prompt_length {int(plen)}, {len(tokens)} tokens, "
                     f"steps summing to {int(np.sum(steps))})")


def check_existing(data_dir: str, name: str, version: str, samples: int = 256) -> None:
  """DataError unless the prepared version reads back: its info, every split's record count, and
  `samples` evenly spaced records of each split (the last one included)."""
  try:
    info = builder.read_info(data_dir, name, version)
    for split, split_info in info.splits.items():
      source = builder.data_source(data_dir, name, version, split)
      n = len(source)
      if n != split_info.num_examples:
        raise ValueError(f"split {split!r} has {n} records, its info says "
                         f"{split_info.num_examples}")
      for i in sorted(set(np.linspace(0, n - 1, min(n, samples)).astype(int).tolist())):
        _check_record(source[i], f"split {split!r} record {i}")
  except Exception as e:  # tfds / array_record raise many types for damaged files
    raise DataError(f"{builder.dataset_dir(data_dir, name, version)} exists but cannot be read "
                    f"({type(e).__name__}: {str(e)[:200]}): pass --overwrite to rebuild it.") from e


def _segment_to_chunks(cfg: PrepareConfig, examples, model, store: ChunkStore, progress: bool):
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  scorer = None
  if cfg.tokenize.mode == "sft":
    if model is None:
      raise ValueError("Segmentation needs the base model: pass model=(LlamaConfig, params).")
    scorer = Scorer(model[0], model[1], cfg.segmentation.metric, max_length=cfg.tokenize.max_length,
                    tokens_per_batch=cfg.tokens_per_batch)
  n_chunks = -(-len(examples) // cfg.chunk_size)
  with tqdm(total=len(examples), desc="segmenting", unit="ex", disable=not progress) as bar:
    for c in range(n_chunks):
      chunk = examples[c * cfg.chunk_size:(c + 1) * cfg.chunk_size]
      if store.has(c):
        bar.update(len(chunk))
        continue
      if scorer is None:
        segs = unit_segments(chunk)
        bar.update(len(chunk))
      else:
        segs = segment_examples(chunk, scorer, cfg.segmentation, on_batch=bar.update)
      store.save(c, segs)
  return n_chunks


def _model_fingerprint(model) -> str:
  """A cheap identity of (config, params): shapes and the first values of every leaf."""
  if model is None:
    return ""
  import jax  # pylint: disable=g-import-not-at-top
  leaves = [np.asarray(x.reshape(-1)[:16], np.float32) for x in jax.tree.leaves(model[1])]
  return fingerprint([repr(model[0])], (np.frombuffer(x.tobytes(), np.int32) for x in leaves))


def _kept(cfg: PrepareConfig, start: float) -> PrepareResult:
  """The existing version, once it reads back (DataError naming the damage otherwise)."""
  check_existing(cfg.data_dir, cfg.name, cfg.version)
  info = builder.read_info(cfg.data_dir, cfg.name, cfg.version)
  return PrepareResult(builder.dataset_dir(cfg.data_dir, cfg.name, cfg.version),
                       dict(info.metadata.get("stats", {})),
                       dict(info.metadata.get("counters", {})), time.time() - start, True)


def prepare_dataset(cfg: PrepareConfig, model: tuple[Any, Any] | None = None,
                    generate: distill.GenerateFn | None = None,
                    progress: bool = True, loader: Callable[[], tuple] | None = None
                    ) -> PrepareResult:
  """Builds `DATA_DIR/hamburger_sft/NAME/VERSION` (see module docstring); returns its stats.

  model: (LlamaConfig, params) of the base model (not needed in lm mode).
  generate: optional self-distillation decoder, `generate(prompt_ids_list) -> response_ids_list`.
  loader: instead of model/generate, a function returning (model, generate), called once the
  inputs have been read and tokenized (so bad inputs fail before a slow model load).
  An existing version is kept if it reads back (DataError if it is damaged: pass overwrite).
  """
  start = time.time()
  builder.check_name(cfg.name)
  if builder.dataset_exists(cfg.data_dir, cfg.name, cfg.version) and not cfg.overwrite:
    return _kept(cfg, start)
  counters: collections.Counter = collections.Counter()
  tok = ChatTokenizer(cfg.tokenize)
  examples = _load_examples(cfg, tok, counters)
  if loader is not None:
    model, generate = loader()
  if generate is not None:
    examples = list(distill.self_distill(examples, generate, cfg.tokenize,
                                         cfg.distill_batch_size, counters))
  vocab_limit = model[0].vocab_size if model is not None and cfg.tokenize.mode == "sft" else None
  _check_vocab(examples, vocab_limit)

  settings = {"source": dataclasses.asdict(cfg.source),
              "tokenize": dataclasses.asdict(cfg.tokenize),
              "segmentation": dataclasses.asdict(cfg.segmentation), "model": cfg.model_id,
              "template": tok.template}
  if cfg.eval_examples >= len(examples):
    raise DataError(f"eval_examples={cfg.eval_examples} leaves no training examples out of "
                    f"{len(examples)}: lower it.")
  key = fingerprint([settings, _model_fingerprint(model)],
                    (a for ex in examples for a in (ex.prompt, ex.response)))
  store = ChunkStore(f"{cfg.data_dir}/.work/{cfg.name}-{cfg.version}-{key}")
  n_chunks = _segment_to_chunks(cfg, examples, model, store, progress)

  eval_ids = set(np.random.default_rng(cfg.seed).permutation(len(examples))[:cfg.eval_examples]
                 .tolist())
  stats = SegmentStats().add_all(ex for c in range(n_chunks) for ex in store.load(c))
  counters["examples_written"] = stats.examples
  splits = {"train": _split(store, n_chunks, eval_ids, False)}
  if eval_ids:
    splits["validation"] = _split(store, n_chunks, eval_ids, True)
  metadata = {"stats": stats.to_dict(), "counters": dict(counters), "template": tok.template,
              "max_steps": cfg.segmentation.max_steps, "vocab_size": tok.vocab_size,
              "settings": settings}
  path = builder.write_dataset(splits, cfg.data_dir, cfg.name, cfg.version, metadata,
                               overwrite=cfg.overwrite, progress=progress)
  store.clear()
  return PrepareResult(path, stats.to_dict(), dict(counters), time.time() - start, False)


def _split(store: ChunkStore, n_chunks: int, eval_ids: set, want_eval: bool):
  """A generator function over the stored examples whose index is (not) in eval_ids."""
  def gen():
    i = 0
    for c in range(n_chunks):
      for ex in store.load(c):
        if (i in eval_ids) == want_eval:
          yield ex
        i += 1
  return gen


def load_model(spec: str, model_path: str | None, vocab_size: int, seed: int = 0):
  """'random:PRESET' or 'MODULE:FUNCTION' -> (LlamaConfig, params)."""
  kind, _, arg = spec.partition(":")
  if kind == "random":
    import jax  # pylint: disable=g-import-not-at-top
    from hamburger_jax.model.config import BASE_PRESETS  # pylint: disable=g-import-not-at-top
    from hamburger_jax.model.llama import init_llama_params  # pylint: disable=g-import-not-at-top
    if arg not in BASE_PRESETS:
      raise ValueError(f"Unknown preset {arg!r}; known: {sorted(BASE_PRESETS)}.")
    cfg = dataclasses.replace(BASE_PRESETS[arg],
                              vocab_size=max(vocab_size, BASE_PRESETS[arg].vocab_size))
    return cfg, jax.jit(lambda key: init_llama_params(cfg, key))(jax.random.PRNGKey(seed))
  if not arg:
    raise ValueError(f"--model {spec!r}: use random:PRESET or MODULE:FUNCTION.")
  loader: Callable[..., Any] = getattr(importlib.import_module(kind), arg)
  return loader(model_path) if model_path else loader()


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m hamburger_jax.data.prepare",
                              description=__doc__.split("\n\n")[0])
  src = {f.name: f.default for f in dataclasses.fields(SourceConfig)}
  add = p.add_argument
  add("--inputs", required=True, help="files/dirs/globs (comma-separated), tfds:NAME or hf:NAME")
  for name in ("format", "prompt_field", "response_field", "system_field", "messages_field",
               "text_field", "json_records_key", "text_unit", "text_separator", "encoding",
               "split", "tfds_data_dir", "hf_config", "on_error"):
    add(f"--{name}", default=src[name])
  add("--max_examples", type=int, default=None)
  add("--mode", default="sft", choices=("sft", "lm"))
  add("--tokenizer", required=True, help="a tokenizers tokenizer.json")
  add("--template", default="auto")
  add("--system_prompt", default=None)
  add("--max_length", type=int, default=2048)
  add("--overlong", default="truncate", choices=("truncate", "drop", "split"))
  add("--bos_token", default=None)
  add("--eos_token", default=None)
  add("--lm_prefix", default="")
  add("--model", default="random:tiny", help="random:PRESET or MODULE:FUNCTION")
  add("--model_path", default=None)
  add("--strategy", default="decreasing_v2")
  add("--metric", default="entropy", choices=("entropy", "probability"))
  add("--max_steps", type=int, default=4)
  add("--min_value", type=float, default=0.05, help="decreasing_v2: values below this always merge")
  add("--ratio", type=float, default=0.3, help="decreasing(_v2): ratio to the group's max / first")
  add("--threshold_p", type=float, default=None)
  add("--threshold_vocab_size", type=int, default=None, help="N of H(p) (default: model vocab)")
  add("--data_dir", required=True)
  add("--name", required=True)
  add("--version", default=builder.DEFAULT_VERSION)
  add("--overwrite", action="store_true")
  add("--eval_examples", type=int, default=0)
  add("--seed", type=int, default=0)
  add("--chunk_size", type=int, default=2048)
  add("--tokens_per_batch", type=int, default=8192)
  add("--distill", default=None, help="MODULE:FUNCTION(model_cfg, params, tokenizer) -> generate")
  add("--no_progress", action="store_true")
  return p


def main(argv: Sequence[str] | None = None) -> PrepareResult:
  a = _parser().parse_args(argv)
  source = SourceConfig(**{f.name: getattr(a, f.name) for f in dataclasses.fields(SourceConfig)
                           if f.name in vars(a)})
  tcfg = TokenizeConfig(tokenizer_path=a.tokenizer, template=a.template, mode=a.mode,
                        system_prompt=a.system_prompt, max_length=a.max_length,
                        overlong=a.overlong, bos_token=a.bos_token, eos_token=a.eos_token,
                        lm_prefix=a.lm_prefix)
  scfg = SegmentationConfig(strategy=a.strategy, max_steps=a.max_steps, metric=a.metric,
                            min_value=a.min_value, ratio=a.ratio, threshold_p=a.threshold_p,
                            vocab_size=a.threshold_vocab_size)
  cfg = PrepareConfig(source, tcfg, scfg, a.data_dir, a.name, a.version, a.overwrite,
                      a.eval_examples, a.seed, a.chunk_size, a.tokens_per_batch,
                      model_id=f"{a.model}@{a.model_path}")
  kind, _, arg = a.model.partition(":")
  if a.mode == "sft" and kind == "random":
    from hamburger_jax.model.config import BASE_PRESETS  # pylint: disable=g-import-not-at-top
    if arg not in BASE_PRESETS:
      raise ValueError(f"--model {a.model}: unknown preset {arg!r}; known: {sorted(BASE_PRESETS)}.")
  builder.check_name(a.name)

  def loader():
    model = generate = None
    if a.mode == "sft":
      model = load_model(a.model, a.model_path, ChatTokenizer(tcfg).vocab_size, a.seed)
    if a.distill:
      mod, _, fn = a.distill.partition(":")
      generate = getattr(importlib.import_module(mod), fn)(*(model or (None, None)),
                                                           ChatTokenizer(tcfg))
    return model, generate
  result = prepare_dataset(cfg, progress=not a.no_progress, loader=loader)
  if result.skipped:
    print(f"{result.path} exists: kept (pass --overwrite to rebuild).")
  else:
    print(f"Wrote {result.path} in {result.seconds:.1f} s "
          f"({result.stats['examples'] / max(result.seconds, 1e-9):.1f} examples/s).")
  stats = SegmentStats(result.stats.get("examples", 0), result.stats.get("prompt_tokens", 0),
                       result.stats.get("response_tokens", 0), result.stats.get("groups", 0),
                       collections.Counter({int(k): v for k, v in
                                            result.stats.get("group_size_histogram", {}).items()}))
  print(stats.format(result.counters))
  return result


if __name__ == "__main__":
  try:
    main()
  except (DataError, ValueError, OSError) as e:   # inputs, names, settings, unreadable files
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
