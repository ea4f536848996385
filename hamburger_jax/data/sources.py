"""Where (prompt, response) text pairs come from: local files, TFDS datasets, Hugging Face datasets.

`read_examples(cfg, counters)` yields `RawExample`s. Inputs (`SourceConfig.inputs`):

  local files    comma-separated paths, directories (every *.jsonl/*.json/*.parquet/*.txt inside,
                 sorted) or globs; the format comes from the extension or `format`.
  tfds:NAME      a prepared TFDS dataset (array_record; read with `tfds.data_source`, no TF),
                 e.g. `tfds:my_sft/default:1.0.0` with `tfds_data_dir`.
  hf:NAME        a Hugging Face dataset (needs the optional `datasets` package and its cache/net).

Fields are named by `prompt_field` / `response_field` (dotted paths reach into nested records,
integers index lists: `conversation.0.text`). `messages_field` instead names a list of
{"role", "content"} turns whose last (assistant) turn is the response. In plain-text files every
line / paragraph / file is one text: in "lm" mode it is the response; in "sft" mode it is split at
`text_separator` into prompt and response.

Malformed input raises `DataError` naming the file, line and fix, or, with `on_error="skip"`, is
skipped and counted in `counters[reason]`.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import json
import os
from typing import Any, Iterator, NamedTuple

_EXTENSIONS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".txt": "text",
               ".text": "text"}


class DataError(ValueError):
  """Input data that cannot be used; the message names the place and the fix."""


class RawExample(NamedTuple):
  prompt: str | list[dict[str, str]] | None   # text, or the conversation before the response
  response: str
  system: str | None
  origin: str                                 # "file:line" (or dataset and index) for messages


@dataclasses.dataclass(frozen=True)
class SourceConfig:
  """Which records to read and how to find the prompt and response in them."""
  inputs: str                        # paths / dirs / globs (comma-separated), tfds:NAME or hf:NAME
  format: str = "auto"               # auto | jsonl | json | parquet | text
  mode: str = "sft"                  # sft: prompt + response; lm: text only (plain LM data)
  prompt_field: str = "prompt"
  response_field: str = "response"
  system_field: str = ""             # optional per-record system message
  messages_field: str = ""           # list of {"role", "content"}; the last turn is the response
  text_field: str = "text"           # lm mode: the text of structured records
  json_records_key: str = ""         # json: key of the list of records ("" = top-level list)
  text_unit: str = "line"            # text files: line | paragraph | file
  text_separator: str = ""           # text files in sft mode: prompt<sep>response
  encoding: str = "utf-8"
  split: str = "train"               # tfds / hf split
  tfds_data_dir: str | None = None
  hf_config: str | None = None
  on_error: str = "raise"            # raise | skip (and count)
  max_examples: int | None = None

  def __post_init__(self):
    if self.mode not in ("sft", "lm"):
      raise ValueError(f"mode must be 'sft' or 'lm', got {self.mode!r}.")
    if self.on_error not in ("raise", "skip"):
      raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}.")
    if self.text_unit not in ("line", "paragraph", "file"):
      raise ValueError(f"text_unit must be line, paragraph or file, got {self.text_unit!r}.")
    if self.max_examples is not None and self.max_examples < 1:
      raise ValueError(f"max_examples (--max_examples) must be >= 1, got {self.max_examples}.")


class _Skip(Exception):
  """A record to skip (or to raise as DataError, per on_error)."""

  def __init__(self, reason: str, message: str):
    super().__init__(message)
    self.reason = reason


def _get(record: Any, path: str, where: str, flag: str) -> Any:
  """record[path] where path is dotted; raises _Skip('missing_field') naming the fix."""
  cur = record
  for part in path.split("."):
    if isinstance(cur, dict) and part in cur:
      cur = cur[part]
    elif isinstance(cur, (list, tuple)) and part.lstrip("-").isdigit() and \
        -len(cur) <= int(part) < len(cur):
      cur = cur[int(part)]
    else:
      fields = sorted(cur) if isinstance(cur, dict) else type(cur).__name__
      raise _Skip("missing_field", f"{where}: no field {path!r} in the record (it has: {fields}). "
                  f"Set {flag} to the right name, or on_error='skip' to skip such records.")
  return cur


def _text(value: Any, name: str, where: str) -> str:
  if isinstance(value, bytes):
    try:
      return value.decode("utf-8")
    except UnicodeDecodeError as e:
      raise _Skip("bad_encoding", f"{where}: field {name!r} is not UTF-8 ({e}).") from e
  if not isinstance(value, str):
    raise _Skip("bad_field", f"{where}: field {name!r} holds {type(value).__name__}, not text. "
                "Point the field option at a text field.")
  if not value.isascii():
    try:
      value.encode("utf-8")
    except UnicodeEncodeError as e:              # a lone surrogate, e.g. JSON's "\ud800"
      raise _Skip("bad_encoding", f"{where}: field {name!r} holds {value[e.start]!r} at "
                  f"character {e.start}, which is not valid text (a lone surrogate). Fix the "
                  "record or set on_error='skip'.") from e
  return value


def _from_messages(turns: Any, where: str, flag: str) -> tuple[list[dict[str, str]], str]:
  ok = isinstance(turns, (list, tuple)) and turns and all(
      isinstance(t, dict) and "role" in t and "content" in t for t in turns)
  if not ok:
    raise _Skip("bad_field", f"{where}: {flag} must be a list of {{'role', 'content'}} turns.")
  if turns[-1]["role"] != "assistant":
    raise _Skip("bad_field", f"{where}: the last turn is {turns[-1]['role']!r}, not 'assistant'; "
                "the last turn is taken as the response.")
  prompt = [{"role": str(t["role"]), "content": _text(t["content"], "content", where)}
            for t in turns[:-1]]
  return prompt, _text(turns[-1]["content"], "content", where)


def record_to_example(record: Any, cfg: SourceConfig, where: str) -> RawExample:
  """One structured record -> RawExample (raises _Skip on a malformed record, whatever fails)."""
  try:
    return _record_to_example(record, cfg, where)
  except _Skip:
    raise
  except Exception as e:  # pylint: disable=broad-except  # any other per-record failure
    raise _Skip("bad_record", f"{where}: the record cannot be read ({type(e).__name__}: "
                f"{str(e)[:200]}). Fix it or set on_error='skip'.") from e


def _record_to_example(record: Any, cfg: SourceConfig, where: str) -> RawExample:
  if not isinstance(record, dict):
    raise _Skip("bad_record", f"{where}: expected an object with fields, got "
                f"{type(record).__name__}.")
  system = None
  if cfg.system_field:
    value = _get(record, cfg.system_field, where, "system_field")
    system = None if value is None else _text(value, cfg.system_field, where)
  if cfg.mode == "lm":
    return RawExample(None, _text(_get(record, cfg.text_field, where, "text_field"),
                                  cfg.text_field, where), None, where)
  if cfg.messages_field:
    prompt, response = _from_messages(_get(record, cfg.messages_field, where, "messages_field"),
                                      where, "messages_field")
    return RawExample(prompt, response, system, where)
  prompt = _get(record, cfg.prompt_field, where, "prompt_field")
  if isinstance(prompt, (list, tuple)):
    prompt, _ = _from_messages(list(prompt) + [{"role": "assistant", "content": ""}], where,
                               "prompt_field")
  else:
    prompt = _text(prompt, cfg.prompt_field, where)
  response = _text(_get(record, cfg.response_field, where, "response_field"), cfg.response_field,
                   where)
  return RawExample(prompt, response, system, where)


def _decode(raw: bytes, cfg: SourceConfig, where: str) -> str:
  try:
    return raw.decode(cfg.encoding)
  except UnicodeDecodeError as e:
    raise _Skip("bad_encoding", f"{where}: not valid {cfg.encoding} (byte 0x{raw[e.start]:02x} at "
                f"column {e.start + 1}). Re-encode the file (e.g. `iconv -f latin1 -t utf-8`) or "
                "set encoding.") from e


def _jsonl(path: str, cfg: SourceConfig) -> Iterator[RawExample | _Skip]:
  with open(path, "rb") as f:
    for lineno, raw in enumerate(f, start=1):
      where = f"{path}:{lineno}"
      try:
        line = _decode(raw, cfg, where)
        if not line.strip():
          continue
        try:
          record = json.loads(line)
        except json.JSONDecodeError as e:
          raise _Skip("bad_json", f"{where}: invalid JSON ({e.msg} at column {e.colno}). Fix the "
                      "line or set on_error='skip'.") from e
        yield record_to_example(record, cfg, where)
      except _Skip as s:
        yield s


def _json(path: str, cfg: SourceConfig) -> Iterator[RawExample | _Skip]:
  with open(path, "rb") as f:
    raw = f.read()
  try:
    text = raw.decode(cfg.encoding)
  except UnicodeDecodeError as e:
    line = raw[:e.start].count(b"\n") + 1
    raise DataError(f"{path}:{line}: not valid {cfg.encoding} (byte 0x{raw[e.start]:02x}). "
                    "Re-encode the file (e.g. `iconv -f latin1 -t utf-8`) or set encoding.") from e
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg}). For one record per line name "
                    "the file *.jsonl or set format='jsonl'.") from e
  if cfg.json_records_key:
    if not isinstance(data, dict) or cfg.json_records_key not in data:
      raise DataError(f"{path}: no top-level key {cfg.json_records_key!r}; set json_records_key.")
    data = data[cfg.json_records_key]
  if not isinstance(data, list):
    keys = sorted(data) if isinstance(data, dict) else type(data).__name__
    raise DataError(f"{path}: expected a list of records at the top level (found {keys}); set "
                    "json_records_key to the key that holds the list.")
  for i, record in enumerate(data):
    try:
      yield record_to_example(record, cfg, f"{path}: record {i}")
    except _Skip as s:
      yield s


def _parquet(path: str, cfg: SourceConfig) -> Iterator[RawExample | _Skip]:
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  row = 0
  for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
    for record in batch.to_pylist():
      try:
        yield record_to_example(record, cfg, f"{path}: row {row}")
      except _Skip as s:
        yield s
      row += 1


def _text_units(path: str, cfg: SourceConfig) -> Iterator[tuple[str, bytes]]:
  with open(path, "rb") as f:
    if cfg.text_unit == "file":
      yield f"{path}:1", f.read().rstrip(b"\r\n")
      return
    if cfg.text_unit == "line":
      for lineno, raw in enumerate(f, start=1):
        yield f"{path}:{lineno}", raw.rstrip(b"\r\n")
      return
    buf, start = [], 1
    for lineno, raw in enumerate(f, start=1):
      if raw.strip():
        if not buf:
          start = lineno
        buf.append(raw)
      elif buf:
        yield f"{path}:{start}", b"".join(buf).rstrip(b"\r\n")
        buf = []
    if buf:
      yield f"{path}:{start}", b"".join(buf).rstrip(b"\r\n")


def _text_file(path: str, cfg: SourceConfig) -> Iterator[RawExample | _Skip]:
  for where, raw in _text_units(path, cfg):
    try:
      text = _decode(raw, cfg, where)
      if not text.strip():
        continue
      if cfg.mode == "lm":
        yield RawExample(None, text, None, where)
      elif not cfg.text_separator or cfg.text_separator not in text:
        raise _Skip("missing_field", f"{where}: no prompt/response separator "
                    f"{cfg.text_separator!r} in the text. Set text_separator (e.g. '\\t'), or "
                    "use mode='lm' for plain text.")
      else:
        prompt, response = text.split(cfg.text_separator, 1)
        yield RawExample(prompt, response, None, where)
    except _Skip as s:
      yield s


def _tfds(name: str, cfg: SourceConfig) -> Iterator[RawExample | _Skip]:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    source = tfds.data_source(name, split=cfg.split, data_dir=cfg.tfds_data_dir, download=False)
  except Exception as e:  # pylint: disable=broad-except
    raise DataError(f"tfds:{name}: cannot open split {cfg.split!r} under data dir "
                    f"{cfg.tfds_data_dir!r} ({type(e).__name__}: {e}). Prepare it in array_record "
                    "format first (without TF, tfrecord datasets cannot be read).") from e
  for i in range(len(source)):
    try:
      yield record_to_example(source[i], cfg, f"tfds:{name}[{cfg.split}] #{i}")
    except _Skip as s:
      yield s


def _hf(name: str, cfg: SourceConfig) -> Iterator[RawExample | _Skip]:
  try:
    import datasets  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise DataError(f"hf:{name}: Hugging Face sources need the optional package `datasets` "
                    "(pip install datasets); or export the data to JSONL/Parquet and pass the "
                    "file.") from e
  ds = datasets.load_dataset(name, cfg.hf_config, split=cfg.split)
  for i, record in enumerate(ds):
    try:
      yield record_to_example(record, cfg, f"hf:{name}[{cfg.split}] #{i}")
    except _Skip as s:
      yield s


def list_files(inputs: str) -> list[str]:
  """Comma-separated paths / directories / globs -> the files, in order (DataError if none)."""
  files: list[str] = []
  for item in [s.strip() for s in inputs.split(",") if s.strip()]:
    if os.path.isdir(item):
      found = sorted(p for p in glob.glob(os.path.join(item, "**", "*"), recursive=True)
                     if os.path.splitext(p)[1] in _EXTENSIONS)
    elif any(c in item for c in "*?["):
      found = sorted(glob.glob(item, recursive=True))
    elif os.path.isfile(item):
      found = [item]
    else:
      raise DataError(f"Input {item!r} does not exist. Pass files, directories, globs, "
                      "tfds:NAME or hf:NAME.")
    if not found:
      raise DataError(f"Input {item!r} matches no data files (*.jsonl, *.json, *.parquet, *.txt).")
    files.extend(found)
  return files


def _file_format(path: str, cfg: SourceConfig) -> str:
  if cfg.format != "auto":
    return cfg.format
  fmt = _EXTENSIONS.get(os.path.splitext(path)[1].lower())
  if fmt is None:
    raise DataError(f"{path}: unknown extension; set format to jsonl, json, parquet or text.")
  return fmt


_READERS = {"jsonl": _jsonl, "json": _json, "parquet": _parquet, "text": _text_file}


def _streams(cfg: SourceConfig, counters: collections.Counter) -> Iterator[RawExample | _Skip]:
  if cfg.inputs.startswith("tfds:"):
    yield from _tfds(cfg.inputs[5:], cfg)
    return
  if cfg.inputs.startswith("hf:"):
    yield from _hf(cfg.inputs[3:], cfg)
    return
  for path in list_files(cfg.inputs):
    fmt = _file_format(path, cfg)
    if fmt not in _READERS:
      raise DataError(f"Unknown format {fmt!r}; use one of {sorted(_READERS)}.")
    if os.path.getsize(path) == 0:
      yield _Skip("empty_file", f"{path} is empty: remove it from the inputs or fill it (or set "
                  "on_error='skip').")
      continue
    counters["files"] += 1
    yield from _READERS[fmt](path, cfg)


def read_examples(cfg: SourceConfig,
                  counters: collections.Counter | None = None) -> Iterator[RawExample]:
  """Yields the source's examples; bad records raise DataError or are counted in `counters`."""
  counters = collections.Counter() if counters is None else counters
  n = 0
  for item in _streams(cfg, counters):
    if isinstance(item, _Skip):
      if cfg.on_error == "raise":
        raise DataError(str(item))
      counters[f"skipped_{item.reason}"] += 1
      continue
    counters["records"] += 1
    yield item
    n += 1
    if cfg.max_examples is not None and n >= cfg.max_examples:
      return
