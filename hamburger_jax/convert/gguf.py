"""Llama-architecture GGUF files (llama.cpp) -> (LlamaConfig, base params tree).

    cfg, params = load_gguf_llama("SmolLM2-135M-Instruct.Q4_1.gguf")
    LlamaModel(cfg).apply({"params": params}, tokens)

Every tensor is dequantized to float32 with `gguf.quants.dequantize` (F32, F16, BF16, Q4_0/1,
Q5_0/1, Q8_0, the K-quants, ...; Q4_1 and Q8_0 by `gguf_quants`, the same numbers) and then cast to the requested dtype: quantized weights load
exactly as llama.cpp dequantizes them, not as the original full-precision model.

Layout notes:
* GGUF tensor dims are stored in ggml order (fastest-varying first); the reader hands out the
  data as numpy arrays in the reversed (row-major) order, so a linear weight arrives as the torch
  `[out, in]` matrix and the token embedding as `[vocab, D]`.
* llama.cpp's `convert_hf_to_gguf.py` permutes the rows of `q_proj` / `k_proj` (per head:
  interleaves the two rotary halves) because its RoPE rotates adjacent pairs. `unpermute_qk` undoes
  it so the weights work with this project's HF "rotate-half" RoPE.
* Llama-3.1-style RoPE scaling is stored as a `rope_freqs.weight` tensor of per-frequency factors;
  it is turned back into `RopeScaling` when it matches the standard Llama-3 parameterisation.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from hamburger_jax.model.config import LlamaConfig, RopeScaling, dtype_from_name
from hamburger_jax.convert.errors import CheckpointError
from hamburger_jax.convert import gguf_quants
from hamburger_jax.convert.gguf_index import ByteSwapped, GGUFIndex
from hamburger_jax.convert.tree_map import KeyMap, load_into_tree
from hamburger_jax.model.layers import rope_inv_freq
from hamburger_jax.model.llama import init_llama_params

GGUF_MAGIC = b"GGUF"
_MISSING = object()

# GGUF tensor name (per layer, after "blk.N.") -> (path inside "layers_N", transpose?).
_LAYER_TENSORS = {
    "attn_q.weight": (("self_attn", "q_proj", "kernel"), True),
    "attn_k.weight": (("self_attn", "k_proj", "kernel"), True),
    "attn_v.weight": (("self_attn", "v_proj", "kernel"), True),
    "attn_output.weight": (("self_attn", "o_proj", "kernel"), True),
    "ffn_gate.weight": (("mlp", "gate_proj", "kernel"), True),
    "ffn_up.weight": (("mlp", "up_proj", "kernel"), True),
    "ffn_down.weight": (("mlp", "down_proj", "kernel"), True),
    "attn_norm.weight": (("input_layernorm", "scale"), False),
    "ffn_norm.weight": (("post_attention_layernorm", "scale"), False),
}
ROPE_FREQS = "rope_freqs.weight"


def _import_gguf():
  try:
    import gguf  # noqa: PLC0415
  except ImportError as e:  # pragma: no cover - exercised only without the package
    raise ImportError("Reading GGUF files needs the `gguf` package (pip install gguf).") from e
  return gguf


def open_gguf(path: str | os.PathLike):
  """A reader over `path` (`gguf_index.GGUFIndex`: the fields and tensors of a `gguf.GGUFReader`,
  which still reads byte-swapped files), with CheckpointError for missing/foreign/truncated files."""
  gguf = _import_gguf()
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise CheckpointError(f"No such GGUF file: {path}.")
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    magic = f.read(4)
  if magic != GGUF_MAGIC:
    raise CheckpointError(f"{path} is not a GGUF file: it starts with {magic!r}, not the magic "
                          f"{GGUF_MAGIC!r}" + (" (the file is empty)." if size == 0 else "."))
  try:
    try:
      reader = GGUFIndex(path)
    except ByteSwapped:
      reader = gguf.GGUFReader(path, "r")
  except Exception as e:  # noqa: BLE001 - the readers raise ValueError/IndexError/... on bad data
    raise CheckpointError(f"{path} is a corrupt or truncated GGUF file ({size} bytes): the header "
                          f"could not be parsed ({type(e).__name__}: {e}).") from e
  # Tensor data is mapped lazily: a file cut inside the tensor data parses, but its last tensors
  # are short. Check that every tensor's bytes are present.
  for t in reader.tensors:
    if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
      raise CheckpointError(f"{path} is truncated ({size} bytes): tensor {t.name!r} needs bytes "
                            f"{t.data_offset}..{t.data_offset + t.n_bytes}.")
  return reader


def gguf_field(reader, key: str, default: Any = _MISSING, *, source: str = "GGUF file") -> Any:
  """The value of metadata `key` (scalar, string or list); `default` if absent, else an error."""
  field = reader.fields.get(key)
  if field is None:
    if default is _MISSING:
      raise CheckpointError(f"{source} lacks the metadata key {key!r}.")
    return default
  return field.contents()


def gguf_array_len(reader, key: str) -> int | None:
  """The length of an array field without decoding it (None when absent)."""
  field = reader.fields.get(key)
  return None if field is None else len(field.data)


def gguf_special_ids(reader) -> tuple[int | None, tuple[int, ...]]:
  """(bos id, eos ids) from tokenizer.ggml.*: eos, then end-of-turn / end-of-message if set."""
  bos = gguf_field(reader, "tokenizer.ggml.bos_token_id", None)
  eos = []
  for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
              "tokenizer.ggml.eom_token_id"):
    v = gguf_field(reader, key, None)
    if v is not None and int(v) not in eos:
      eos.append(int(v))
  return (None if bos is None else int(bos)), tuple(eos)


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp's q/k row permutation ([out, in] torch layout), as in convert_hf_to_gguf.py."""
  return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
      w.shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
  """The inverse of `permute_qk`: GGUF q/k rows -> HF rotate-half layout."""
  return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(
      w.shape)


def _rope_scaling_from_freqs(factors: np.ndarray, head_dim: int, theta: float,
                             original_ctx: int | None, source: str) -> RopeScaling | None:
  """Recovers Llama-3 `RopeScaling` from llama.cpp's rope_freqs factors (base / scaled freq)."""
  factors = np.asarray(factors, np.float64).reshape(-1)
  if factors.shape != (head_dim // 2,):
    raise CheckpointError(f"{source}: {ROPE_FREQS} has {factors.size} entries; head_dim // 2 = "
                          f"{head_dim // 2} expected.")
  if np.allclose(factors, 1.0):
    return None
  base = rope_inv_freq(head_dim, theta, None).astype(np.float64)
  candidates = []
  for ctx in dict.fromkeys([original_ctx or 8192, 8192]):
    candidates.append(RopeScaling(factor=float(factors.max()), low_freq_factor=1.0,
                                  high_freq_factor=4.0, original_max_position_embeddings=int(ctx)))
  for scaling in candidates:
    scaled = rope_inv_freq(head_dim, theta, scaling).astype(np.float64)
    if np.allclose(base / scaled, factors, rtol=1e-4, atol=1e-5):
      return scaling
  raise CheckpointError(f"{source}: {ROPE_FREQS} holds RoPE frequency factors that do not match "
                        "Llama-3 scaling (factor=max, low_freq_factor=1, high_freq_factor=4); this "
                        "RoPE scaling is not supported.")


def gguf_llama_config(reader, dtype: str = "float32", *, source: str = "GGUF file",
                      **overrides) -> LlamaConfig:
  """A LlamaConfig from the metadata (and tensor list) of a Llama-architecture GGUF reader."""
  arch = gguf_field(reader, "general.architecture", source=source)
  if arch != "llama":
    raise CheckpointError(f"{source} holds a {arch!r} model; only the 'llama' architecture is "
                          "supported.")
  get = lambda key, default=_MISSING: gguf_field(reader, f"llama.{key}", default, source=source)
  if get("expert_count", 0):
    raise CheckpointError(f"{source} is a mixture-of-experts llama (llama.expert_count = "
                          f"{get('expert_count')}); only dense models are supported.")
  hidden = int(get("embedding_length"))
  n_head = int(get("attention.head_count"))
  n_kv = int(get("attention.head_count_kv", n_head))
  head_dim = int(get("attention.key_length", hidden // n_head))
  if int(get("attention.value_length", head_dim)) != head_dim:
    raise CheckpointError(f"{source}: attention.value_length differs from key_length; not "
                          "supported.")
  rot = int(get("rope.dimension_count", head_dim))
  if rot != head_dim:
    raise CheckpointError(f"{source}: rope.dimension_count = {rot} < head_dim = {head_dim} "
                          "(partial rotary); not supported.")
  scaling_type = get("rope.scaling.type", "none")
  if scaling_type not in ("none", "") and float(get("rope.scaling.factor", 1.0)) != 1.0:
    raise CheckpointError(f"{source}: RoPE scaling {scaling_type!r} is not supported.")
  theta = _f32_value(get("rope.freq_base", 10000.0))
  tensors = {t.name: t for t in reader.tensors}
  scaling = None
  if ROPE_FREQS in tensors:
    scaling = _rope_scaling_from_freqs(
        _dequantize(tensors[ROPE_FREQS]), head_dim, theta,
        get("rope.scaling.original_context_length", None), source)
  vocab = gguf_array_len(reader, "tokenizer.ggml.tokens")
  if vocab is None:
    vocab = get("vocab_size", None)
  if vocab is None:
    raise CheckpointError(f"{source} has neither tokenizer.ggml.tokens nor llama.vocab_size.")
  bos, eos = gguf_special_ids(reader)
  kwargs = dict(
      vocab_size=int(vocab), hidden_size=hidden, intermediate_size=int(get("feed_forward_length")),
      num_layers=int(get("block_count")), num_heads=n_head, num_kv_heads=n_kv, head_dim=head_dim,
      rope_theta=theta, rope_scaling=scaling,
      rms_norm_eps=_f32_value(get("attention.layer_norm_rms_epsilon", 1e-5)),
      tie_word_embeddings="output.weight" not in tensors, bos_token_id=bos, eos_token_ids=eos,
      param_dtype=dtype, dtype=dtype)
  kwargs.update(overrides)
  try:
    return LlamaConfig(**kwargs)
  except ValueError as e:
    raise CheckpointError(f"{source}: inconsistent llama metadata ({e}).") from e


def _f32_value(v) -> float:
  """A float stored as float32 in the metadata, as its shortest decimal (1e-05, not 9.99e-06)."""
  return float(str(np.float32(v)))


def gguf_key_map(cfg: LlamaConfig) -> KeyMap:
  """{GGUF tensor name: (path in the params tree, transpose?)} for a Llama model."""
  out: KeyMap = {
      "token_embd.weight": (("embed_tokens", "embedding"), False),
      "output_norm.weight": (("norm", "scale"), False),
  }
  for i in range(cfg.num_layers):
    for name, (path, transpose) in _LAYER_TENSORS.items():
      out[f"blk.{i}.{name}"] = ((f"layers_{i}",) + path, transpose)
  if not cfg.tie_word_embeddings:
    out["output.weight"] = (("lm_head", "kernel"), True)
  return out


def _dequantize(tensor) -> np.ndarray:
  """float32 numpy array of a ReaderTensor, in numpy (reversed ggml) dim order."""
  gguf = _import_gguf()
  try:
    arr = gguf_quants.dequantize(tensor.data, tensor.tensor_type)
    if arr is None:
      arr = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
  except NotImplementedError as e:
    raise CheckpointError(f"Tensor {tensor.name!r} has type {tensor.tensor_type.name}, which "
                          f"gguf {getattr(gguf, '__version__', '')} cannot dequantize.") from e
  shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
  return np.asarray(arr, np.float32).reshape(shape)


def gguf_tensor(reader_tensor, cfg: LlamaConfig) -> np.ndarray:
  """One dequantized tensor in HF/torch layout (q/k rows un-permuted)."""
  arr = _dequantize(reader_tensor)
  name = reader_tensor.name
  if name.endswith(".attn_q.weight"):
    arr = unpermute_qk(arr, cfg.num_heads)
  elif name.endswith(".attn_k.weight"):
    arr = unpermute_qk(arr, cfg.num_kv_heads)
  return arr


def load_gguf_llama(path: str | os.PathLike, dtype: str = "float32",
                    **config_overrides) -> tuple[LlamaConfig, dict]:
  """Llama GGUF file -> (LlamaConfig, base params tree of numpy arrays in `dtype`).

  `dtype` ('float32' / 'bfloat16' / 'float16') sets the config's param_dtype and compute dtype;
  `config_overrides` replace other LlamaConfig fields. Raises CheckpointError on a missing,
  non-GGUF, truncated or non-llama file and on missing / unexpected / mis-shaped tensors.
  """
  dtype_from_name(dtype)
  source = os.fspath(path)
  reader = open_gguf(path)
  cfg = gguf_llama_config(reader, dtype, source=source, **config_overrides)
  tensors = {t.name: t for t in reader.tensors}
  key_map = gguf_key_map(cfg)
  unexpected = sorted(set(tensors) - set(key_map) - {ROPE_FREQS})
  if unexpected:
    more = f" (and {len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
    raise CheckpointError(f"{source} holds tensors this Llama model has no place for: "
                          f"{unexpected[:5]}{more} (biases and extra modules are not supported).")
  if "token_embd.weight" in tensors:
    rows = int(tensors["token_embd.weight"].shape[-1])
    if rows != cfg.vocab_size:
      raise CheckpointError(f"{source}: token_embd has {rows} rows but the tokenizer lists "
                            f"{cfg.vocab_size} tokens.")
  abstract = jax.eval_shape(lambda: init_llama_params(cfg, jax.random.PRNGKey(0)))
  # rope_freqs is read into the config's RopeScaling above, not into a parameter.
  params = load_into_tree(key_map, lambda name: gguf_tensor(tensors[name], cfg), set(tensors),
                          abstract, source=source, ignore=lambda key: key == ROPE_FREQS)
  return cfg, params
