"""Causal attention over packed rows (segment ids), four ways with the same numbers.

All take q [B, T, N, H], k/v [B, T, K, H] (GQA: N a multiple of K) and segment_ids [B, T], and
return [B, T, N, H]: query t sees key s iff s <= t and segment_ids[s] == segment_ids[t].
`packed_attention` picks one by name (see `hamburger_jax.model.execution`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hamburger_jax.model import partitioning

NEG_INF = -1e30
_SHORT = 128   # sequences shorter than this (the micro decoder's) use xla for splash / cudnn


def xla_attention(q, k, v, mask):
  """mask [B, T, L] -> [B, T, N, H]; scores [B, K, G, T, L] in float32, softmax, then @ v."""
  b, t, n, h = q.shape
  kv_heads = k.shape[2]
  q = q.reshape(b, t, kv_heads, n // kv_heads, h)
  scores = jnp.einsum("btkgh,blkh->bkgtl", q, k, preferred_element_type=jnp.float32)
  scores = scores / jnp.sqrt(jnp.float32(h))
  scores = jnp.where(mask[:, None, None], scores, NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgtl,blkh->btkgh", probs, v)
  return out.reshape(b, t, n, h)


def causal_segment_mask(segment_ids):
  """[B, T] segment ids -> [B, T, T] mask: causal and within the same segment."""
  t = segment_ids.shape[-1]
  causal = jnp.tril(jnp.ones((t, t), bool))
  same = segment_ids[:, :, None] == segment_ids[:, None, :]
  return causal[None] & same


# --- blockwise (flash attention in plain JAX) ------------------------------------------------

def _key_blocks(k, v, segment_ids, block: int):
  """Pads keys to a multiple of `block` -> k/v [nb, B, blk, K, H], segments [nb, B, blk], idx."""
  b, t = segment_ids.shape
  nb = -(-t // block)
  pad = nb * block - t
  padded = lambda x, value: jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2),
                                    constant_values=value)
  to_blocks = lambda x: x.reshape((b, nb, block) + x.shape[2:]).swapaxes(0, 1)
  idx = jnp.arange(nb * block, dtype=jnp.int32).reshape(nb, block)
  return (to_blocks(padded(k, 0)), to_blocks(padded(v, 0)), to_blocks(padded(segment_ids, -1)),
          idx)


def _block_scores(qg, kj, q_seg, k_seg, kj_idx):
  """Scaled scores [B, K, G, T, blk] (float32) and their mask for one key block."""
  t = qg.shape[3]
  s = jnp.einsum("bkgth,blkh->bkgtl", qg, kj, preferred_element_type=jnp.float32)
  s = s / jnp.sqrt(jnp.float32(qg.shape[-1]))
  causal = jnp.arange(t, dtype=jnp.int32)[:, None] >= kj_idx[None, :]
  mask = (causal[None] & (q_seg[:, :, None] == k_seg[:, None, :]))[:, None, None]
  return jnp.where(mask, s, NEG_INF), mask


def _grouped(q, kv_heads: int):
  b, t, n, h = q.shape
  return q.reshape(b, t, kv_heads, n // kv_heads, h).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, H]


def _ungrouped(x):
  b, kh, g, t, h = x.shape
  return x.transpose(0, 3, 1, 2, 4).reshape(b, t, kh * g, h)


def _blockwise_forward(q, k, v, segment_ids, block):
  qg = _grouped(q, k.shape[2])
  kb, vb, segb, idx = _key_blocks(k, v, segment_ids, block)

  def body(carry, xs):
    m, l, acc = carry
    kj, vj, k_seg, kj_idx = xs
    s, mask = _block_scores(qg, kj, segment_ids, k_seg, kj_idx)
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
    corr = jnp.exp(m - m_new)
    acc = acc * corr[..., None] + jnp.einsum("bkgtl,blkh->bkgth", p.astype(vj.dtype), vj,
                                             preferred_element_type=jnp.float32)
    return (m_new, l * corr + p.sum(-1), acc), None

  stats = qg.shape[:4]
  init = (jnp.full(stats, NEG_INF, jnp.float32), jnp.zeros(stats, jnp.float32),
          jnp.zeros(qg.shape, jnp.float32))
  (m, l, acc), _ = jax.lax.scan(body, init, (kb, vb, segb, idx))
  out = _ungrouped(acc / l[..., None]).astype(q.dtype)
  return out, m + jnp.log(l)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def blockwise_attention(q, k, v, segment_ids, block: int = 512):
  """Online softmax over key blocks of `block`; the backward pass recomputes each block."""
  return _blockwise_forward(q, k, v, segment_ids, block)[0]


def _blockwise_fwd(q, k, v, segment_ids, block):
  out, lse = _blockwise_forward(q, k, v, segment_ids, block)
  return out, (q, k, v, segment_ids, out, lse)


def _blockwise_bwd(block, res, d_out):
  q, k, v, segment_ids, out, lse = res
  kv_heads, t = k.shape[2], k.shape[1]
  qg = _grouped(q, kv_heads)
  dog = _grouped(d_out, kv_heads)
  delta = jnp.sum(dog.astype(jnp.float32) * _grouped(out, kv_heads).astype(jnp.float32), -1)
  kb, vb, segb, idx = _key_blocks(k, v, segment_ids, block)
  scale = 1.0 / jnp.sqrt(jnp.float32(q.shape[-1]))

  def body(dq, xs):
    kj, vj, k_seg, kj_idx = xs
    s, mask = _block_scores(qg, kj, segment_ids, k_seg, kj_idx)
    p = jnp.where(mask, jnp.exp(s - lse[..., None]), 0.0)
    dv = jnp.einsum("bkgtl,bkgth->blkh", p.astype(dog.dtype), dog,
                    preferred_element_type=jnp.float32)
    dp = jnp.einsum("bkgth,blkh->bkgtl", dog, vj, preferred_element_type=jnp.float32)
    ds = (p * (dp - delta[..., None]) * scale).astype(qg.dtype)
    dq = dq + jnp.einsum("bkgtl,blkh->bkgth", ds, kj, preferred_element_type=jnp.float32)
    dk = jnp.einsum("bkgtl,bkgth->blkh", ds, qg, preferred_element_type=jnp.float32)
    return dq, (dk, dv)

  dq, (dk, dv) = jax.lax.scan(body, jnp.zeros(qg.shape, jnp.float32), (kb, vb, segb, idx))
  unblock = lambda x: x.swapaxes(0, 1).reshape((k.shape[0], -1) + k.shape[2:])[:, :t]
  return (_ungrouped(dq).astype(q.dtype), unblock(dk).astype(k.dtype),
          unblock(dv).astype(v.dtype), None)


blockwise_attention.defvjp(_blockwise_fwd, _blockwise_bwd)


# --- kernels: splash (TPU), cuDNN (GPU) -------------------------------------------------------

def _splash_local(q, k, v, segment_ids):
  """Splash on local shards: q [B, N, T, H] (pre-scaled), k/v [B, K, T, H] -> [B, N, T, H]."""
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
  n, t = q.shape[1], q.shape[2]
  blk = next(bs for bs in (512, 256, 128) if t % bs == 0)
  sizes = sa.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk,
                        block_kv_dkv=blk, block_kv_dkv_compute=blk, block_q_dq=blk,
                        block_kv_dq=blk)
  mask = sa.MultiHeadMask([sa.CausalMask((t, t)) for _ in range(n)])
  kernel = sa.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes)
  one = lambda q, k, v, seg: kernel(q, k, v, segment_ids=sa.SegmentIds(q=seg, kv=seg))
  return jax.vmap(one)(q, k, v, segment_ids)


def splash_attention(q, k, v, segment_ids):
  """The Pallas TPU splash kernel, shard_mapped over the batch (and head) mesh axes."""
  scale = 1.0 / jnp.sqrt(jnp.float32(q.shape[-1]))
  qt = (q * scale.astype(q.dtype)).transpose(0, 2, 1, 3)
  kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
  mesh = partitioning.current_mesh()
  if mesh is None:
    out = _splash_local(qt, kt, vt, segment_ids)
  else:
    P = jax.sharding.PartitionSpec
    q_spec = partitioning.mesh_axes((partitioning.BATCH, partitioning.HEADS, None, None),
                                    qt.shape)
    heads = q_spec[1] if partitioning.mesh_axes(
        (None, partitioning.HEADS), (1, kt.shape[1]))[1] == q_spec[1] else None
    qs, kvs = P(q_spec[0], heads, None, None), P(q_spec[0], heads, None, None)
    out = jax.shard_map(_splash_local, mesh=mesh, in_specs=(qs, kvs, kvs, P(q_spec[0], None)),
                        out_specs=qs, check_vma=False)(qt, kt, vt, segment_ids)
  return out.transpose(0, 2, 1, 3)


def cudnn_attention(q, k, v, segment_ids):
  """jax.nn.dot_product_attention's cuDNN kernel: causal, plus a [B, 1, T, T] segment mask."""
  same = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
  return jax.nn.dot_product_attention(q, k, v, mask=same, is_causal=True,
                                      implementation="cudnn")


def resolve(kind: str, length: int, dtype) -> str:
  """The implementation `kind` stands for at this length, dtype and platform."""
  plat = partitioning.platform()
  if kind == "auto":
    if plat == "tpu":
      kind = "splash"
    elif plat == "gpu" and jnp.dtype(dtype).itemsize == 2:
      kind = "cudnn"
    else:
      kind = "blockwise" if length > 1024 else "xla"
  if kind in ("splash", "cudnn") and (length < _SHORT or length % _SHORT):
    return "xla"
  needs = {"splash": "tpu", "cudnn": "gpu"}.get(kind)
  if needs and plat != needs:
    raise ValueError(f"attention {kind!r} needs a {needs.upper()} (this is {plat}): use "
                     "'auto', 'blockwise' or 'xla'.")
  return kind


def packed_attention(q, k, v, segment_ids, kind: str = "xla", block: int = 512):
  """Causal attention within segments by the implementation `kind` names -> [B, T, N, H]."""
  kind = resolve(kind, q.shape[1], q.dtype)
  if kind == "xla":
    return xla_attention(q, k, v, causal_segment_mask(segment_ids))
  if kind == "blockwise":
    return blockwise_attention(q, k, v, segment_ids, min(block, q.shape[1]))
  if kind == "splash":
    return splash_attention(q, k, v, segment_ids)
  return cudnn_attention(q, k, v, segment_ids)
