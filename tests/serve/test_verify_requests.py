"""Per-request decoding mode (`"verify": true|false`): a --verify_requests server runs a merged
and a verified engine over one copy of the base weights and answers each request in its mode;
other servers refuse the mode they do not run with a 400 naming the flag."""

from __future__ import annotations

import concurrent.futures
import os
import time

import httpx2
import jax
import pytest

from benchmarks import serve_load
from hamburger_jax.decode.batching import Event, Request
from hamburger_jax.decode.checkpoint import VERIFY_DRAFTER_FILE, open_checkpoint
from hamburger_jax.decode.prompts import UsageError
from hamburger_jax.decode.sampler import TRACE_COUNTS
from hamburger_jax.recipes.verify_drafter import export
from hamburger_jax.serve import cli, engines, protocol
from hamburger_jax.serve.protocol import ApiError, Limits, Modes
from hamburger_jax.serve.responses import merged_usage, usage
from hamburger_jax.convert import save_hamburger

from tests.serve.conftest import (CACHE_LENGTH, MODEL, GatedEngine, ServerThread, make_engine,
                                  serving)

CONFIDENCE = 0.6


class _FakeEngine:
  """Ids from 0 (as every engine's); each step gives each running request one token, up to 2."""

  def __init__(self, name: str, log: list):
    self.name, self.log = name, log
    self.running: dict[int, int] = {}
    self.cancelled: list[int] = []
    self.max_prompt_len, self.eos_ids, self.scorer = 16, (2,), name
    self._next = 0

  def submit(self, request):
    self._next += 1
    self.running[self._next - 1] = 0
    return self._next - 1

  def cancel(self, request_id):
    self.cancelled.append(request_id)
    self.running.pop(request_id, None)

  def has_work(self):
    return bool(self.running)

  def step(self):
    self.log.append(self.name)
    events = []
    for rid in list(self.running):
      self.running[rid] += 1
      done = self.running[rid] == 2
      events.append(Event(rid, [self.running[rid]], done, "length" if done else None, 1, 1))
      if done:
        del self.running[rid]
    return events


def test_the_router_keeps_ids_apart_takes_turns_and_cancels_on_the_right_engine():
  log: list[str] = []
  merged, verified = _FakeEngine("merged", log), _FakeEngine("verify", log)
  router = engines.ModeRouter(merged, verified)
  ids = [router.submit(engines.ModeRequest([1], verify=v)) for v in (False, True, None, True)]
  ids.append(router.submit(Request([1])))                       # a plain Request: the default
  assert ids == [0, 1, 2, 3, 4] and router.scorer == "merged"
  assert sorted(merged.running) == [0, 1, 2] and sorted(verified.running) == [0, 1]
  router.cancel(3)                                              # verified engine's id 1
  assert verified.cancelled == [1] and merged.cancelled == []
  seen: dict[int, list[int]] = {}
  while router.has_work():
    for e in router.step():
      seen.setdefault(e.request_id, []).extend(e.new_tokens)
  assert log == ["merged", "verify", "merged", "verify"]         # turns while both have work
  assert seen == {0: [1, 2], 1: [1, 2], 2: [1, 2], 4: [1, 2]}
  router.cancel(0)                                              # finished: nothing to cancel
  assert merged.cancelled == []
  assert engines.ModeRouter(merged, verified, default=True).mode(Request([1]))


def test_settings_take_the_mode_and_its_knob_defaults():
  limits = Limits(max_tokens=8, default_max_tokens=8, default_confidence=0.7,
                  modes=Modes(both=True))
  body = {"model": MODEL, "prompt": [1]}
  merged = protocol.parse_settings(body, limits, chat=False)
  verified = protocol.parse_settings(dict(body, verify=True), limits, chat=False)
  assert (merged.verify, merged.confidence) == (False, 0.7)
  assert (verified.verify, verified.confidence) == (True, limits.verify_confidence)
  given = protocol.parse_settings(dict(body, verify=True, confidence=0.5), limits, chat=False)
  assert given.confidence == 0.5
  only_verify = Limits(max_tokens=8, default_max_tokens=8, modes=Modes(default=True))
  assert protocol.parse_settings(body, only_verify, chat=False).verify
  for bad in ("yes", 1, [True]):
    with pytest.raises(ApiError, match="'verify' must be true or false"):
      protocol.parse_settings(dict(body, verify=bad), limits, chat=False)


def test_usage_of_a_verified_answer_counts_one_kv_entry_per_token():
  u = usage(prompt_tokens=10, tokens=12, macro_steps=5, verified=True)["hamburger"]
  assert u["kv_entries"] == u["kv_entries_base"] == 21
  assert (u["mode"], u["tokens_per_forward"]) == ("verify", 2.4)
  both = merged_usage([usage(10, 12, 5, True), usage(3, 4, 2, True)])["hamburger"]
  assert both["mode"] == "verify" and both["kv_entries"] == both["kv_entries_base"] == 21 + 6
  assert "mode" not in usage(10, 12, 5)["hamburger"]


def _post(server, body: dict, path: str = "/v1/completions"):
  return httpx2.post(server.url + path, json=dict({"model": MODEL}, **body), timeout=120)


def _leaves(tree) -> list:
  return jax.tree_util.tree_leaves(tree)


def test_both_modes_in_flight_answer_as_their_own_decodes(tmp_path, tiny_model):
  ckpt = str(tmp_path / "tiny")
  save_hamburger(ckpt, *tiny_model)
  d = open_checkpoint(ckpt, token_ids=True)
  shifted = jax.tree_util.tree_map(lambda x: x * 0.5, d.params["micro_decoder"])
  export(os.path.join(ckpt, VERIFY_DRAFTER_FILE), shifted, {"how": "a test"})
  a = cli.ServeArgs(ckpt=ckpt, token_ids=True, verify_requests=True, model_id=MODEL,
                    cache_length=CACHE_LENGTH, num_slots=4, chunk_steps=4)
  service = cli.build(a)
  router = service.worker.engine
  merged, verified = router.engines[False], router.engines[True]
  assert all(x is y for x, y in zip(_leaves(merged.params["base"]),
                                    _leaves(verified.params["base"])))    # one copy of the base
  assert not any(x is y for x, y in zip(_leaves(merged.params["micro_decoder"]),
                                        _leaves(verified.params["micro_decoder"])))
  workload = serve_load.make_workload(6, seed=1, vocab=d.llama.vocab_size, prompt_lens=(2, 12),
                                      max_tokens=(8, 16))
  want = {False: serve_load.reference_tokens(d.config, d.params, workload, CACHE_LENGTH,
                                              CONFIDENCE),
          True: serve_load.reference_tokens(d.config, d.params, workload, CACHE_LENGTH,
                                            CONFIDENCE, base=True)}
  traces = dict(TRACE_COUNTS)
  gate = service.worker.engine = GatedEngine(router)     # every request in before the first step
  with ServerThread(service) as server:
    assert _post(server, {"prompt": [1], "verify": "yes"}).status_code == 400
    jobs = [(p, m, i % 2 == 0) for i, (p, m) in enumerate(workload)]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
      futures = [pool.submit(_post, server, {"prompt": p, "max_tokens": m, "temperature": 0,
                                             "confidence": CONFIDENCE, "verify": v})
                 for p, m, v in jobs]
      while service.worker.pending < len(jobs):
        time.sleep(0.02)
      gate.open()
      answers = [f.result() for f in futures]
    health = httpx2.get(server.url + "/health").json()
  for (p, m, v), (i, r) in zip(jobs, enumerate(answers)):
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["token_ids"] == want[v][i], (i, v)
    assert out["usage"]["hamburger"].get("mode") == ("verify" if v else None)
  assert want[False] != want[True]                        # the two modes answer differently
  assert dict(TRACE_COUNTS) == traces                     # warmed at start: nothing compiled since
  assert (health["modes"], health["default_mode"]) == (["merged", "verify"], "merged")
  assert service.worker.pending == 0


@pytest.mark.parametrize("args, verify, fix", [
    ({}, True, "--verify_requests"), ({"verify": True}, False, "--verify_requests"),
    ({"base": True}, True, "--base")])
def test_a_mode_the_server_does_not_run_is_refused(tiny_model, tokenizer, args, verify, fix):
  cfg, params = tiny_model
  with serving(make_engine("serial", cfg, params), cfg, tokenizer, **args) as server:
    for path, body in (("/v1/completions", {"prompt": [1, 5]}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
      r = _post(server, dict(body, verify=verify), path)
      assert r.status_code == 400, r.text
      error = r.json()["error"]
      assert error["param"] == "verify" and fix in error["message"]
      assert "\n" not in error["message"]
      r = _post(server, dict(body, verify="true"), path)
      assert r.status_code == 400 and "must be true or false" in r.json()["error"]["message"]
    assert httpx2.get(server.url + "/health").json()["modes"] == Modes(
        default=bool(args.get("verify")), base=bool(args.get("base"))).names()


def test_verify_requests_with_base_is_refused():
  assert cli.parse_args(["--ckpt", "x", "--verify_requests"]).verify_requests
  with pytest.raises(UsageError, match="--verify_requests"):
    cli.check_args(cli.parse_args(["--ckpt", "x", "--verify_requests", "--base"]))
