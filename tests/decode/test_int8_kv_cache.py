"""Decoding with int8 KV buffers (`Sampler(kv_cache="int8")`, `decode.py --kv_cache int8`):
continuous batching decodes each request as alone and a bad value is one clear error. (Verified
decoding with them, on one device and on a mesh: test_mesh.py; the CLI:
test_quantized_decoding.py.)"""

import io

import pytest

from hamburger_jax.decode.batching import ContinuousBatcher, Request
from hamburger_jax.decode.cli import DecodeArgs, run
from hamburger_jax.decode.prompts import UsageError
from hamburger_jax.decode.sampler import DecodeInputError, Sampler
from hamburger_jax.serve import cli as serve_cli
from hamburger_jax.testing.fixtures import make_tiny_checkpoint
from tests.decode.helpers import CACHE_LENGTH, OUT_LENGTH, small_model

PROMPTS = [[1, 5, 7], [3, 9, 11, 2, 4], [7], [8, 8, 8, 8]]
KW = dict(cache_length=CACHE_LENGTH, out_length=OUT_LENGTH, kv_cache="int8")


@pytest.mark.slow
def test_continuous_batching_with_int8_buffers_decodes_each_request_as_alone():
  cfg, params = small_model(0)
  alone = Sampler(cfg, params, **KW)
  batcher = ContinuousBatcher(cfg, params, num_slots=2, cache_length=CACHE_LENGTH,
                              chunk_steps=3, kv_cache="int8")
  ids = {batcher.submit(Request(p, 12, 0.5)): i for i, p in enumerate(PROMPTS)}
  tokens = {rid: [] for rid in ids}
  while batcher.has_work():
    for e in batcher.step():
      tokens[e.request_id] += e.new_tokens
  for rid, i in ids.items():
    assert tokens[rid] == alone.decode([PROMPTS[i]], max_new_tokens=12,
                                       confidence=0.5).tokens[0], f"request {i}"


def test_a_bad_kv_cache_is_one_clear_error(tmp_path):
  cfg, params = small_model(0)
  with pytest.raises(DecodeInputError, match="KV cache 'fp8' is unknown: use one of model, int8"):
    Sampler(cfg, params, cache_length=8, kv_cache="fp8")
  err = io.StringIO()
  code = run(DecodeArgs(ckpt=str(tmp_path), prompt="1,2", token_ids=True, kv_cache="int4"),
             stdout=io.StringIO(), stderr=err)
  assert code == 2
  assert err.getvalue() == "error: --kv_cache 'int4' is unknown: use one of model, int8.\n"
  with pytest.raises(UsageError, match="--kv_cache 'int4' is unknown"):
    serve_cli.check_args(serve_cli.parse_args(["--ckpt", str(tmp_path), "--kv_cache", "int4"]))
  serve_cli.check_args(serve_cli.parse_args(["--ckpt", str(tmp_path), "--kv_cache", "int8"]))


@pytest.mark.slow
def test_the_server_decodes_with_int8_buffers(tmp_path):
  path = make_tiny_checkpoint(str(tmp_path / "tiny"))
  args = serve_cli.ServeArgs(ckpt=path, token_ids=True, kv_cache="int8", cache_length=32,
                             num_slots=2, chunk_steps=2)
  service = serve_cli.build(args)                   # warmed up: one request decoded
  batcher = service.worker.engine
  assert batcher.engine.kv_cache == "int8"
  (completion,) = batcher.generate([Request([1, 5, 7], 6, 0.5)])
  assert len(completion.tokens) == 6 and completion.finish_reason == "length"
