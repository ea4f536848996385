"""A GGUF file's metadata and tensor index in one pass over its header.

    index = GGUFIndex("SmolLM2-135M-Instruct.Q4_1.gguf")
    index.fields["llama.block_count"].contents()      # 30
    index.tensors[0].data                              # numpy view into the memory-mapped file

The same fields and tensors as `gguf.GGUFReader` (`contents()`, `len(field.data)`, and
`gguf.ReaderTensor`s with the same names, types, shapes, offsets and data views), read with
`struct` over the mapped bytes: the `gguf` package builds two numpy views per metadata string,
which takes seconds for a tokenizer's ~100k tokens and merges; here a string array is only
walked for its length, and decoded when its contents are asked for. Little-endian files only
(a byte-swapped file raises `ByteSwapped`; `convert.gguf.open_gguf` reads it with the package).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
from typing import Any

import numpy as np

SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
# GGUF value type -> (struct format, size) of its scalars.
SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
           6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
         6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


class ByteSwapped(ValueError):
  """The file's numbers are stored in the other byte order (a big-endian GGUF)."""


@dataclasses.dataclass(frozen=True)
class Field:
  """One metadata value. value_type: GGUF's type id; item_type and length for arrays; start: the
  byte offset of the value (for string arrays, of their first item)."""
  name: str
  value_type: int
  value: Any = None               # scalars and strings; arrays of scalars as a numpy array
  item_type: int | None = None
  length: int = 1
  start: int = 0
  buffer: Any = dataclasses.field(default=None, repr=False, compare=False)

  @property
  def data(self) -> range:
    """Indices of the items (as `gguf.ReaderField.data`: its length is the array's)."""
    return range(self.length)

  def contents(self) -> Any:
    """The value as Python objects: a scalar, a str, or a list (as `ReaderField.contents()`)."""
    if self.value_type != ARRAY:
      return self.value
    if self.item_type != STRING:
      return self.value.tolist()
    out, offset = [], self.start
    for _ in range(self.length):
      (size,) = struct.unpack_from("<Q", self.buffer, offset)
      out.append(str(self.buffer[offset + 8:offset + 8 + size], encoding="utf-8"))
      offset += 8 + size
    return out


class GGUFIndex:
  """The metadata fields {key: Field} and tensors [gguf.ReaderTensor] of a GGUF file.

  Raises ValueError on a file whose header is not GGUF or cannot be parsed. A tensor whose bytes
  run past the end of the file gets its (short) raw bytes as data: callers check
  `tensor.data.nbytes == tensor.n_bytes`.
  """

  def __init__(self, path: str | os.PathLike):
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, ReaderTensor  # noqa: PLC0415
    from gguf.quants import quant_shape_to_byte_shape  # noqa: PLC0415
    path = os.fspath(path)
    with open(path, "rb") as f:
      if os.fstat(f.fileno()).st_size == 0:
        raise ValueError("the file is empty")
      buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    self.path, self._buf = path, buf
    try:
      magic, version, tensor_count, kv_count = struct.unpack_from("<4sIQQ", buf, 0)
    except struct.error as e:
      raise ValueError(f"the header is cut short ({e})") from None
    if magic != b"GGUF":
      raise ValueError("GGUF magic invalid")
    if version & 0xFFFF == 0 and version:
      raise ByteSwapped(f"GGUF version field {version:#x}: a byte-swapped file")
    if version not in SUPPORTED_VERSIONS:
      raise ValueError(f"GGUF version {version} (this reader reads {SUPPORTED_VERSIONS})")
    self.version = version
    offset = 24
    self.fields: dict[str, Field] = {}
    try:
      for _ in range(kv_count):
        key, offset = self._string(offset)
        (value_type,), offset = struct.unpack_from("<I", buf, offset), offset + 4
        field, offset = self._value(key, value_type, offset)
        if key in self.fields:
          raise ValueError(f"duplicate key {key!r}")
        self.fields[key] = field
      infos = []
      for _ in range(tensor_count):
        name, offset = self._string(offset)
        (n_dims,), offset = struct.unpack_from("<I", buf, offset), offset + 4
        dims = struct.unpack_from(f"<{n_dims}Q", buf, offset)
        offset += 8 * n_dims
        raw_type, tensor_offset = struct.unpack_from("<IQ", buf, offset)
        offset += 12
        infos.append((name, dims, GGMLQuantizationType(raw_type), tensor_offset))
    except (struct.error, UnicodeDecodeError) as e:
      raise ValueError(f"the header is cut short or malformed ({type(e).__name__}: {e})") from None
    alignment = self.fields.get("general.alignment")
    self.alignment = DEFAULT_ALIGNMENT if alignment is None else alignment.value
    if alignment is not None and (alignment.value_type != 4 or self.alignment <= 0
                                  or self.alignment & (self.alignment - 1)):
      raise ValueError(f"general.alignment must be a power of two (uint32), got "
                       f"{alignment.value!r}")
    self.data_offset = -(-offset // self.alignment) * self.alignment
    mapped = np.memmap(path, mode="r")
    self.tensors, names = [], set()
    for name, dims, ggml_type, tensor_offset in infos:
      if name in names:
        raise ValueError(f"duplicate tensor {name!r}")
      names.add(name)
      n_elements = int(np.prod(dims))
      block_size, type_size = GGML_QUANT_SIZES[ggml_type]
      n_bytes = n_elements * type_size // block_size
      start = self.data_offset + tensor_offset
      np_dims = tuple(reversed(dims))
      item_type = _ITEM_TYPES.get(ggml_type.name)
      if item_type is None:
        item_type, np_dims = np.uint8, quant_shape_to_byte_shape(np_dims, ggml_type)
      raw = mapped[start:start + n_bytes]
      data = raw.view(item_type).reshape(np_dims) if raw.nbytes == n_bytes else raw
      self.tensors.append(ReaderTensor(
          name=name, tensor_type=ggml_type, shape=np.asarray(dims, np.uint64),
          n_elements=n_elements, n_bytes=n_bytes, data_offset=start, data=data, field=None))

  def _string(self, offset: int) -> tuple[str, int]:
    (size,) = struct.unpack_from("<Q", self._buf, offset)
    end = offset + 8 + size
    if end > len(self._buf):
      raise struct.error(f"a string of {size} bytes at offset {offset} runs past the end")
    return str(self._buf[offset + 8:end], encoding="utf-8"), end

  def _value(self, key: str, value_type: int, offset: int) -> tuple[Field, int]:
    buf = self._buf
    if value_type in SCALARS:
      fmt, size = SCALARS[value_type]
      (value,) = struct.unpack_from(fmt, buf, offset)
      return Field(key, value_type, NUMPY[value_type](value).tolist()), offset + size
    if value_type == STRING:
      value, end = self._string(offset)
      return Field(key, value_type, value), end
    if value_type != ARRAY:
      raise ValueError(f"{key!r} has the unknown value type {value_type}")
    item_type, length = struct.unpack_from("<IQ", buf, offset)
    offset += 12
    if item_type in SCALARS:
      _, size = SCALARS[item_type]
      if offset + size * length > len(buf):
        raise struct.error(f"{key!r}: an array of {length} items runs past the end")
      value = np.frombuffer(buf, NUMPY[item_type], length, offset).copy()
      return Field(key, value_type, value, item_type, length, offset), offset + size * length
    if item_type != STRING:
      raise ValueError(f"{key!r} is an array of value type {item_type}, which this reader "
                       "does not read")
    start = offset
    for _ in range(length):
      (size,) = struct.unpack_from("<Q", buf, offset)
      offset += 8 + size
    if offset > len(buf):
      raise struct.error(f"{key!r}: an array of {length} strings runs past the end")
    return Field(key, value_type, None, item_type, length, start, buf), offset


# ggml types whose data is a plain numpy array of elements; every other type is blocks of bytes.
_ITEM_TYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8,
               "I16": np.int16, "I32": np.int32, "I64": np.int64}
