"""int8 weight-only decoding (`Sampler(quantize="int8")`, `decode.py --quantize int8|int8:G`): the
loop reads int8 weights, decodes what its own model says, stays near the float model's greedy
tokens, and knobs do not recompile."""

import io
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hamburger_jax.decode import loop as lp
from hamburger_jax.decode.cli import DecodeArgs, run
from hamburger_jax.decode.models import decode_model
from hamburger_jax.decode.prompts import UsageError
from hamburger_jax.decode.sampler import DecodeInputError, Sampler
from hamburger_jax.model import quantize as q
from hamburger_jax.model.llama import LlamaModel
from hamburger_jax.serve import cli as serve_cli
from hamburger_jax.testing.fixtures import make_tiny_checkpoint
from tests.decode.helpers import (CACHE_LENGTH, OUT_LENGTH, check_against_teacher_forcing,
                                  drafting_model, small_model, small_sampler)

PROMPTS = [np.random.default_rng(i).integers(0, 256, 5).tolist() for i in range(4)]


@pytest.mark.slow
def test_int8_decoding_is_its_models_own_and_near_the_float_greedy():
  cfg, params = small_model(0)
  sampler = small_sampler(0, quantize="int8")
  assert q.is_quantized(sampler.params)
  result = sampler.decode(PROMPTS, max_new_tokens=16, confidence=0.8)
  for row, prompt in enumerate(PROMPTS):          # every token and group is the int8 model's
    check_against_teacher_forcing(cfg, sampler.params, prompt, result, row, 0.8)
  # Plain greedy answers: equal up to a position where the float model's two best tokens are
  # nearer than the int8 error of a logit (the tiny random model has such near-ties).
  kw = dict(base=True, cache_length=32, out_length=32)
  want = Sampler(cfg, params, **kw).decode(PROMPTS, max_new_tokens=24).tokens
  got = Sampler(cfg, params, quantize="int8", **kw).decode(PROMPTS, max_new_tokens=24).tokens
  for prompt, w, g in zip(PROMPTS, want, got):
    k = next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), None)
    if k is None:
      continue
    logits = LlamaModel(cfg.base).apply({"params": params["base"]},
                                        jnp.asarray([prompt + w[:k]])).logits[0, -1]
    assert float(logits[w[k]] - logits[g[k]]) < 0.05 * float(jnp.abs(logits).max())


@pytest.mark.slow
def test_the_decode_loop_reads_int8_weights():
  sampler = small_sampler(0, quantize="int8")
  state, _ = sampler.start(PROMPTS, max_new_tokens=4)
  hlo = jax.jit(lp.loop, static_argnums=0).lower(sampler.engine, sampler.params, state,
                                                 jnp.int32(8)).compile().as_text()
  entry = next(line for line in hlo.splitlines() if line.startswith("ENTRY"))
  int8_leaves = [x for x in jax.tree.leaves(sampler.params) if x.dtype == jnp.int8]
  assert entry.count("s8[") == len(int8_leaves) > 0       # passed in as int8, not dequantized
  big = max(int8_leaves, key=lambda x: x.size)
  assert f"s8[{','.join(map(str, big.shape))}]" in entry


@pytest.mark.slow
def test_knobs_do_not_recompile():
  sampler = small_sampler(0, quantize="int8")
  sampler.decode(PROMPTS, max_new_tokens=8, confidence=0.8)
  traces = dict(lp.TRACE_COUNTS)
  sampler.decode(PROMPTS, max_new_tokens=12, confidence=0.5, temperature=0.7, top_k=5, seed=3)
  assert dict(lp.TRACE_COUNTS) == traces and sampler.compile_s == 0.0


@pytest.mark.slow
def test_draft_rows_come_from_int8_weights():
  cfg, params = small_model(0)
  ids = np.arange(0, 256, 4)
  quantized = q.quantize_params(params, cfg)
  _, float_params = decode_model(cfg, params, draft_vocab=ids)
  _, int8_params = decode_model(cfg, quantized, draft_vocab=ids)
  scale = float(quantized["base"]["embed_tokens"]["embedding_scale"].max())
  np.testing.assert_allclose(int8_params["draft"]["table"], float_params["draft"]["table"],
                             atol=scale / 2 + 1e-6)


def test_a_bad_mode_is_one_clear_error(tmp_path):
  cfg, params = small_model(0)
  with pytest.raises(DecodeInputError, match="quantize must be one of none, int8, int8:G, "
                                             "int8:Gz, micro:<mode> .*, got 'int4'"):
    Sampler(cfg, params, cache_length=8, quantize="int4")
  err = io.StringIO()
  code = run(DecodeArgs(ckpt=str(tmp_path), prompt="1,2", token_ids=True, quantize="fp8"),
             stdout=io.StringIO(), stderr=err)
  assert code == 2
  assert err.getvalue() == ("error: --quantize must be one of none, int8, int8:G, int8:Gz, "
                            "micro:<mode> (G: a group size along the input width, e.g. int8:64; "
                            "z: a zero point per group; micro: the drafter's weights only, e.g. "
                            "micro:int8), got 'fp8'.\n")
  with pytest.raises(UsageError, match="--quantize must be one of none, int8, int8:G, "
                                       "int8:Gz, micro:<mode> .*, got 'int4'"):
    serve_cli.check_args(serve_cli.parse_args(["--ckpt", str(tmp_path), "--quantize", "int4"]))
  serve_cli.check_args(serve_cli.parse_args(["--ckpt", str(tmp_path), "--quantize", "int8"]))
  serve_cli.check_args(serve_cli.parse_args(["--ckpt", str(tmp_path), "--quantize", "int8:64"]))
  serve_cli.check_args(serve_cli.parse_args(["--ckpt", str(tmp_path), "--quantize",
                                             "micro:int8"]))
  with pytest.raises(DecodeInputError, match="got 'micro:int4'"):
    Sampler(cfg, params, cache_length=8, quantize="micro:int4")


def test_an_int8_drafter_leaves_the_base_and_its_verified_answers_as_they_were():
  """quantize "micro:int8": the micro decoder's kernels and the draft rows are int8, the base is
  the same arrays, and verified greedy decoding still gives the base's tokens, drafts accepted."""
  cfg, params = drafting_model()
  ids = np.random.default_rng(0).permutation(256)
  kw = dict(cache_length=CACHE_LENGTH, out_length=OUT_LENGTH)
  verified = Sampler(cfg, params, verify=True, draft_vocab=ids, quantize="micro:int8", **kw)
  p = verified.params
  for want, got in zip(jax.tree.leaves(params["base"]), jax.tree.leaves(p["base"])):
    assert got.dtype == want.dtype and np.array_equal(np.asarray(got), np.asarray(want))
  kernels = [x for path, x in jax.tree_util.tree_leaves_with_path(p["micro_decoder"])
             if "kernel" in jax.tree_util.keystr(path) and x.ndim == 2]
  assert sum(x.dtype == jnp.int8 for x in kernels) == 7 * cfg.num_micro_layers   # q k v o, mlp
  assert p["draft"]["table"].dtype == jnp.int8
  assert p["draft"][q.DRAFT_TABLE_SCALE].shape == (p["draft"]["table"].shape[0],)
  prompts = [[1, 5, 7], [3, 9, 11, 2, 4], [7], [100, 3]]
  want = Sampler(cfg, params, base=True, **kw).decode(prompts, max_new_tokens=24)
  got = verified.decode(prompts, max_new_tokens=24, confidence=0.5)
  assert got.tokens == want.tokens
  reached, accepted = got.draft_counts
  assert 0 < sum(accepted) < sum(reached)
  loop = next(exe for (name, _), exe in verified.executables._compiled.items() if name == "loop")
  entry = next(line for line in loop.as_text().splitlines() if line.startswith("ENTRY"))
  assert entry.count("s8[") == sum(x.dtype == jnp.int8 for x in jax.tree.leaves(p))  # read as int8


@pytest.mark.slow
def test_cli_decodes_with_int8_weights(tmp_path):
  path = make_tiny_checkpoint(str(tmp_path / "tiny"))
  outputs = {}
  for mode in ("none", "int8", "int8:16"):       # int8 weights with int8 KV buffers too
    out = io.StringIO()
    code = run(DecodeArgs(ckpt=path, prompt="1,5,7", token_ids=True, json=True, max_new_tokens=8,
                          quantize=mode, kv_cache="int8" if mode == "int8" else "model"),
               stdout=out, stderr=io.StringIO())
    assert code == 0
    outputs[mode] = json.loads(out.getvalue())["outputs"][0]["tokens"]
  for mode in ("int8", "int8:16"):
    assert len(outputs[mode]) == 8 and outputs[mode][0] == outputs["none"][0]
  err = io.StringIO()
  code = run(DecodeArgs(ckpt=path, prompt="1,5,7", token_ids=True, quantize="int8:24"),
             stdout=io.StringIO(), stderr=err)
  assert code == 2 and err.getvalue().count("\n") == 1
  assert err.getvalue().startswith("error: --quantize int8:24: G=24 does not divide 64, ")
  assert err.getvalue().endswith("use a G that divides 64, e.g. int8:16.\n")
