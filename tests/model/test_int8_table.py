"""int8 token tables (`model/int8_table.py`): a table stored in blocks of 32 rows (as on a TPU)
looks up, heads, decodes and shards as the [V, D] table it holds."""

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.decode import mesh as mesh_lib
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.model import int8_table
from hamburger_jax.model import quantize as q
from hamburger_jax.model.llama import LlamaModel
from tests import compiled
from tests.decode.helpers import small_model

PROMPTS = [np.random.default_rng(i).integers(0, 256, 5).tolist() for i in range(3)]


def test_block_lookups_are_the_rows():
  table = jnp.asarray(np.random.default_rng(0).integers(-128, 128, (96, 8)), jnp.int8)
  blocks = int8_table.to_blocks(table)
  assert int8_table.is_blocked(blocks) and blocks.shape == (3, 32, 8)
  np.testing.assert_array_equal(np.asarray(int8_table.flat(blocks)), np.asarray(table))
  ids = jnp.asarray([[0, 95], [33, 64], [31, 32]])
  for t in (table, blocks):
    np.testing.assert_array_equal(np.asarray(int8_table.take(t, ids)), np.asarray(table)[ids])


def test_tables_in_blocks_embed_head_decode_and_shard_as_the_flat_ones():
  cfg, params = small_model(0)
  for mode in ("int8", "int8:16"):
    flat = q.apply_mode(params, cfg, mode, blocks=False)
    blocked = q.apply_mode(params, cfg, mode, blocks=True)
    table = blocked["base"]["embed_tokens"]["embedding"]
    assert table.shape == (cfg.base.vocab_size // 32, 32, cfg.base.hidden_size)
    assert q.weight_bytes(blocked) == q.weight_bytes(flat)
    tokens = jnp.asarray([PROMPTS[0] + PROMPTS[1]])
    llama = LlamaModel(cfg.base)
    logits = [compiled.apply(llama, {"params": p["base"]}, tokens).logits for p in (flat, blocked)]
    np.testing.assert_allclose(np.asarray(logits[1]), np.asarray(logits[0]), rtol=1e-6, atol=1e-6)
    hidden = jnp.asarray(np.random.default_rng(1).normal(size=(3, cfg.base.hidden_size)),
                         jnp.float32)
    heads = [compiled.apply(llama, {"params": p["base"]}, hidden, decoding=True, method="logits")
             for p in (flat, blocked)]
    np.testing.assert_allclose(np.asarray(heads[1]), np.asarray(heads[0]), rtol=1e-6, atol=1e-6)
    rows = jnp.asarray([1, 7, 200])
    np.testing.assert_array_equal(np.asarray(q.head_rows(blocked["base"], rows, True, jnp.float32)),
                                  np.asarray(q.head_rows(flat["base"], rows, True, jnp.float32)))
    if mode == "int8":
      continue                   # decoding below takes the grouped head, the other tied form
    kw = dict(cache_length=32, out_length=32)
    want = Sampler(cfg, flat, **kw).decode(PROMPTS, max_new_tokens=12, confidence=0.8)
    sampler = Sampler(cfg, blocked, quantize=mode, **kw)      # quantized already: kept as is
    assert int8_table.is_blocked(sampler.params["base"]["embed_tokens"]["embedding"])
    got = sampler.decode(PROMPTS, max_new_tokens=12, confidence=0.8)
    assert got.tokens == want.tokens and got.group_sizes == want.group_sizes
  mesh = mesh_lib.make_decode_mesh("tensor=1")
  specs = mesh_lib.param_shardings(mesh, cfg, blocked)
  flat_specs = mesh_lib.param_shardings(mesh, cfg, flat)
  spec = tuple(specs["base"]["embed_tokens"]["embedding"].spec)
  want = tuple(flat_specs["base"]["embed_tokens"]["embedding"].spec) + (None,) * 2
  assert spec == (want[0], None, want[1]) and spec[0] is not None, spec
  jax.device_put(blocked, specs)
