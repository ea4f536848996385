"""The GGUF reading the loader relies on, against the `gguf` package as the peer: the one-pass
header reader (`convert/gguf_index.py`) and whole-tensor dequantization (`convert/gguf_quants.py`),
on written files of every value type and on the shipped SmolLM2 file."""

import math

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the `gguf` package (pip install gguf) reads GGUF files")

from tests.convert.test_gguf import SMOLLM2, requires_smollm2  # noqa: E402

Q = gguf.GGMLQuantizationType


def assert_same_as_gguf_reader(path):
  """GGUFIndex gives GGUFReader's fields (contents, lengths) and tensors (bytes and views)."""
  from hamburger_jax.convert.gguf_index import GGUFIndex
  want, got = gguf.GGUFReader(path), GGUFIndex(path)
  fields = {k: f for k, f in want.fields.items() if not k.startswith("GGUF.")}
  assert list(got.fields) == list(fields)
  for key, field in fields.items():
    mine = got.fields[key]
    assert mine.contents() == field.contents(), key
    assert type(mine.contents()) is type(field.contents()), key
    assert len(mine.data) == len(field.data), key
  assert [t.name for t in got.tensors] == [t.name for t in want.tensors]
  for a, b in zip(want.tensors, got.tensors):
    assert (a.tensor_type, a.n_elements, a.n_bytes, a.data_offset) == (
        b.tensor_type, b.n_elements, b.n_bytes, b.data_offset), a.name
    assert a.shape.tolist() == b.shape.tolist() and a.data.shape == b.data.shape, a.name
    assert a.data.dtype == b.data.dtype and a.data.tobytes() == b.data.tobytes(), a.name


def test_header_reader_reads_every_value_type_as_the_gguf_package(tmp_path):
  path = str(tmp_path / "kinds.gguf")
  w = gguf.GGUFWriter(path, "llama")
  w.add_uint8("k.u8", 250)
  w.add_int8("k.i8", -7)
  w.add_uint16("k.u16", 65000)
  w.add_int16("k.i16", -300)
  w.add_uint32("k.u32", 4_000_000_000)
  w.add_int32("k.i32", -2_000_000)
  w.add_float32("k.f32", 1e-5)
  w.add_uint64("k.u64", 2**60)
  w.add_int64("k.i64", -(2**40))
  w.add_float64("k.f64", math.pi)
  w.add_bool("k.bool", True)
  w.add_string("k.str", "naïve ✓")
  w.add_array("k.ints", [1, -2, 3])
  w.add_array("k.floats", [0.5, 1.5])
  w.add_array("k.bools", [True, False])
  w.add_array("k.strs", ["", "a b", "ü" * 40])
  w.add_array("k.empty", [])
  w.add_custom_alignment(64)
  rng = np.random.default_rng(0)
  w.add_tensor("f32", rng.normal(size=(3, 5)).astype(np.float32))
  w.add_tensor("f16", rng.normal(size=(7,)).astype(np.float16))
  q8 = gguf.quants.quantize(rng.normal(size=(2, 64)).astype(np.float32), Q.Q8_0)
  w.add_tensor("q8", q8, raw_shape=q8.shape, raw_dtype=Q.Q8_0)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  assert_same_as_gguf_reader(path)


@requires_smollm2
def test_header_reader_reads_smollm2_as_the_gguf_package():
  assert_same_as_gguf_reader(SMOLLM2)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
def test_whole_tensor_dequantization_gives_the_gguf_packages_numbers(qtype):
  from hamburger_jax.convert import gguf_quants
  rng = np.random.default_rng(0)
  quantized = gguf.quants.quantize(rng.normal(size=(6, 96)).astype(np.float32), qtype)
  raw = rng.integers(0, 256, size=(5, 3 * gguf.GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8)
  for data in (quantized, raw, quantized.reshape(2, 3, -1)):   # raw: any scale bits (inf, nan)
    want = gguf.quants.dequantize(data, qtype)
    got = gguf_quants.dequantize(data, qtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
  assert gguf_quants.dequantize(quantized, Q.Q4_0) is None          # left to the package


@requires_smollm2
def test_whole_tensor_dequantization_reads_smollm2_as_the_gguf_package():
  from hamburger_jax.convert import gguf_quants
  from hamburger_jax.convert.gguf_index import GGUFIndex
  checked = 0
  for tensor in GGUFIndex(SMOLLM2).tensors:
    got = gguf_quants.dequantize(tensor.data, tensor.tensor_type)
    if got is not None:
      assert got.tobytes() == gguf.quants.dequantize(tensor.data, tensor.tensor_type).tobytes()
      checked += 1
  assert checked == 211                                   # 210 Q4_1 tensors and the Q8_0 one


def test_a_big_endian_file_is_read_by_the_gguf_package(tmp_path):
  from hamburger_jax.convert.gguf import gguf_field, open_gguf
  path = str(tmp_path / "big.gguf")
  w = gguf.GGUFWriter(path, "llama", endianess=gguf.GGUFEndian.BIG)
  w.add_uint32("k.u32", 7)
  w.add_tensor("t", np.arange(4, dtype=np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  reader = open_gguf(path)
  assert isinstance(reader, gguf.GGUFReader) and gguf_field(reader, "k.u32") == 7
