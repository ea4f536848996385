"""A bounded load test (40 requests, 8 in flight, fixed seed, greedy): every response arrives
and equals the same request decoded alone; the server compiles nothing per request. Run on each
engine, and on the continuous engine with micro-step compaction."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks import serve_load
from tests.serve.conftest import CACHE_LENGTH, MODEL, make_engine, serving
from hamburger_jax.decode.sampler import TRACE_COUNTS

CONFIDENCE = 0.6
KNOBS = {"confidence": CONFIDENCE, "min_token_prob": 0.0}   # request fields


def test_load_nothing_lost_or_mixed(server, tiny_model):
  _check_load(server, tiny_model)


@pytest.mark.slow
def test_load_with_compacted_micro_steps(tiny_model, tokenizer):
  cfg, params = tiny_model
  engine = make_engine("continuous", cfg, params, compact_micro_steps=True)
  assert engine.engine.compact_micro_steps and engine.num_slots == 4
  with serving(engine, cfg, tokenizer, "continuous", max_queue=64) as server:
    _check_load(server, tiny_model)


def _check_load(server, tiny_model):
  cfg, params = tiny_model
  workload = serve_load.make_workload(40, seed=0, vocab=cfg.base.vocab_size,
                                      prompt_lens=(2, 15), max_tokens=(4, 24))
  refs = serve_load.reference_tokens(cfg, params, workload, CACHE_LENGTH, CONFIDENCE)
  asyncio.run(serve_load.run_load(server.url, MODEL, workload[:2], 2, KNOBS))   # compile
  traces = dict(TRACE_COUNTS)
  results, wall = asyncio.run(serve_load.run_load(server.url, MODEL, workload, 8, KNOBS))
  out = serve_load.summarize(results, wall, refs)
  assert out["answered"] == 40, out["failed"]
  assert out["mismatched"] == [] and out["identical_to_alone"]
  assert out["tokens_per_macro_step"] > 1.0          # HAMburger groups, not one token a step
  assert out["latency_p99_s"] >= out["latency_p50_s"] > 0
  assert dict(TRACE_COUNTS) == traces                # no compile while serving the load
  assert server.service.worker.pending == 0
