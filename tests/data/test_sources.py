"""Reading (prompt, response) pairs from files and datasets, and the errors on bad input."""

import collections
import json

import numpy as np
import pytest

from hamburger_jax.data.sources import DataError, SourceConfig, read_examples


def _pairs(cfg, counters=None):
  return [(ex.prompt, ex.response) for ex in read_examples(cfg, counters)]


def _write(path, text, mode="w"):
  with open(path, mode) as f:
    f.write(text)
  return str(path)


def test_jsonl_fixture(helpers):
  got = _pairs(SourceConfig(helpers.SAMPLE_JSONL))
  assert got == helpers.sample_pairs()
  ex = next(read_examples(SourceConfig(helpers.SAMPLE_JSONL)))
  assert ex.origin.endswith("sample_sft.jsonl:1")


def test_json_parquet_and_custom_fields(tmp_path):
  records = [{"q": {"text": f"question {i}"}, "a": f"answer {i}", "sys": "be brief"}
             for i in range(5)]
  cfg = dict(prompt_field="q.text", response_field="a", system_field="sys")
  js = _write(tmp_path / "d.json", json.dumps({"data": records}))
  got = list(read_examples(SourceConfig(js, json_records_key="data", **cfg)))
  assert [(e.prompt, e.response, e.system) for e in got] == [
      (f"question {i}", f"answer {i}", "be brief") for i in range(5)]
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  pq.write_table(pa.Table.from_pylist(records), str(tmp_path / "d.parquet"))
  got_pq = _pairs(SourceConfig(str(tmp_path / "d.parquet"), **cfg))
  assert got_pq == [(f"question {i}", f"answer {i}") for i in range(5)]
  # A directory reads every data file in it, sorted by name.
  assert len(_pairs(SourceConfig(str(tmp_path), json_records_key="data", **cfg))) == 10


def test_messages_field(tmp_path):
  conv = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
          {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"},
          {"role": "assistant", "content": "see you"}]
  path = _write(tmp_path / "m.jsonl", json.dumps({"messages": conv}) + "\n")
  (ex,) = read_examples(SourceConfig(path, messages_field="messages"))
  assert ex.prompt == conv[:-1] and ex.response == "see you"
  bad = _write(tmp_path / "b.jsonl", json.dumps({"messages": conv[:-1]}) + "\n")
  with pytest.raises(DataError, match=r"b.jsonl:1: the last turn is 'user'"):
    list(read_examples(SourceConfig(bad, messages_field="messages")))


def test_text_files(tmp_path):
  path = _write(tmp_path / "t.txt", "first line\n\nsecond para\nstill second\n")
  lines = _pairs(SourceConfig(path, mode="lm"))
  assert lines == [(None, "first line"), (None, "second para"), (None, "still second")]
  paras = _pairs(SourceConfig(path, mode="lm", text_unit="paragraph"))
  assert paras == [(None, "first line"), (None, "second para\nstill second")]
  whole = _pairs(SourceConfig(path, mode="lm", text_unit="file"))
  assert whole == [(None, "first line\n\nsecond para\nstill second")]
  tsv = _write(tmp_path / "p.txt", "hello\tworld\n")
  assert _pairs(SourceConfig(tsv, text_separator="\t")) == [("hello", "world")]
  with pytest.raises(DataError, match=r"t.txt:1: no prompt/response separator"):
    _pairs(SourceConfig(path))


def test_tfds_source(tmp_path):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from tensorflow_datasets.core import registered  # pylint: disable=g-import-not-at-top

  with registered.skip_registration():
    class QaPairs(tfds.core.GeneratorBasedBuilder):  # pylint: disable=unused-variable
      VERSION = tfds.core.Version("1.0.0")

      def _info(self):
        return tfds.core.DatasetInfo(builder=self, disable_shuffling=True,
                                     features=tfds.features.FeaturesDict({
                                         "question": tfds.features.Text(),
                                         "answer": tfds.features.Text()}))

      def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

      def _generate_examples(self):
        for i in range(3):
          yield i, {"question": f"q{i} é", "answer": f"a{i}"}

    QaPairs(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  got = _pairs(SourceConfig("tfds:qa_pairs", tfds_data_dir=str(tmp_path),
                            prompt_field="question", response_field="answer"))
  assert got == [(f"q{i} é", f"a{i}") for i in range(3)]
  with pytest.raises(DataError, match="tfds:nope"):
    _pairs(SourceConfig("tfds:nope", tfds_data_dir=str(tmp_path)))


def test_hf_source_without_datasets_package():
  try:
    import datasets  # pylint: disable=g-import-not-at-top,unused-import
    pytest.skip("the datasets package is installed")
  except ImportError:
    pass
  with pytest.raises(DataError, match="pip install datasets"):
    _pairs(SourceConfig("hf:some/dataset"))


def test_missing_field_names_file_line_and_fix(tmp_path):
  path = _write(tmp_path / "x.jsonl", '{"prompt": "a", "response": "b"}\n'
                '{"prompt": "c", "answer": "d"}\n')
  with pytest.raises(DataError) as e:
    _pairs(SourceConfig(path))
  msg = str(e.value)
  assert "x.jsonl:2" in msg and "'response'" in msg and "answer" in msg
  assert "response_field" in msg
  counters = collections.Counter()
  assert _pairs(SourceConfig(path, on_error="skip"), counters) == [("a", "b")]
  assert counters["skipped_missing_field"] == 1 and counters["records"] == 1


def test_non_utf8_file(tmp_path):
  good = '{"prompt": "a", "response": "b"}\n'.encode()
  bad = '{"prompt": "caf\u00e9", "response": "b"}\n'.encode("latin-1")
  path = _write(tmp_path / "l.jsonl", good + bad, "wb")
  with pytest.raises(DataError, match=r"l.jsonl:2: not valid utf-8 .*iconv"):
    _pairs(SourceConfig(path))
  counters = collections.Counter()
  assert _pairs(SourceConfig(path, on_error="skip"), counters) == [("a", "b")]
  assert counters["skipped_bad_encoding"] == 1
  assert _pairs(SourceConfig(path, encoding="latin-1"))[1] == ("caf\u00e9", "b")
  whole = _write(tmp_path / "l.json", b"[" + bad.strip() + b"]", "wb")
  with pytest.raises(DataError, match=r"l.json:1: not valid utf-8"):
    _pairs(SourceConfig(whole))


def test_empty_file_and_bad_json(tmp_path):
  empty = _write(tmp_path / "e.jsonl", "")
  with pytest.raises(DataError, match=r"e.jsonl is empty"):
    _pairs(SourceConfig(empty))
  counters = collections.Counter()
  ok = _write(tmp_path / "ok.jsonl", '{"prompt": "a", "response": "b"}\n')
  assert _pairs(SourceConfig(f"{empty},{ok}", on_error="skip"), counters) == [("a", "b")]
  assert counters["skipped_empty_file"] == 1
  broken = _write(tmp_path / "j.jsonl", '{"prompt": "a", "response": "b"}\n{"prompt": \n')
  with pytest.raises(DataError, match=r"j.jsonl:2: invalid JSON"):
    _pairs(SourceConfig(broken))
  with pytest.raises(DataError, match="does not exist"):
    _pairs(SourceConfig(str(tmp_path / "missing.jsonl")))
  with pytest.raises(DataError, match="holds int"):
    _pairs(SourceConfig(_write(tmp_path / "n.jsonl", '{"prompt": 3, "response": "b"}\n')))


def test_max_examples(helpers):
  assert len(_pairs(SourceConfig(helpers.SAMPLE_JSONL, max_examples=5))) == 5
  assert np.all([isinstance(p, str) for p, _ in _pairs(SourceConfig(helpers.SAMPLE_JSONL))])
