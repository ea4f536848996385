"""Log-probs over the server: /v1/completions with echo and logprobs and chat logprobs against the
base model's own log-softmax and the engine's decode alone, the tokenizer endpoints, and lm-eval's
`local-completions` log-likelihood requests on the local multiple-choice task
benchmarks/lm_eval_tasks/hamburger_mc (lm-eval tokenizes through the server's /tokenize)."""

from __future__ import annotations

import asyncio
import glob
import json
import threading

import httpx2
import jax
import numpy as np
import openai
import pytest

from tests.serve.conftest import CACHE_LENGTH, CHATML, MODEL, make_engine, run_lm_eval, serving
from hamburger_jax.decode.sampler import Sampler
from hamburger_jax.model.llama import LlamaModel
from hamburger_jax.model.scoring import TRACES
from hamburger_jax.serve import protocol
from hamburger_jax.serve.service import SCORED_TOP, Service
from hamburger_jax.serve.worker import EngineWorker, ShuttingDown
from tests import compiled

PROMPT = "hello the world cat sat on the"


def _post(server, path, body):
  return httpx2.post(server.url + path, json=body, timeout=60)


def _completion(server, **fields):
  r = _post(server, "/v1/completions", dict({"model": MODEL, "temperature": 0}, **fields))
  assert r.status_code == 200, r.text
  return r.json()["choices"][0]


def _check_offsets(text, lp):
  """Every listed token stands in the text at its offset, in order (special tokens, which the
  generated text leaves out, aside)."""
  assert lp["text_offset"] == sorted(lp["text_offset"])
  for token, at in zip(lp["tokens"], lp["text_offset"]):
    assert token in CHATML or text[at:at + len(token)] == token, (text, token, at)


@pytest.fixture(scope="module")
def base_log_probs(tiny_model):
  """ids -> [L, V] float64 log-softmax of the base model's logits (one full forward)."""
  cfg, params = tiny_model

  def run(ids):
    # Right-padded to a multiple of 64 (one program for most texts; causal: the padding changes
    # no position before it).
    padded = np.zeros((1, -(-len(ids) // 64) * 64), np.int32)
    padded[0, :len(ids)] = ids
    logits = compiled.apply(LlamaModel(cfg.base), {"params": params["base"]}, padded).logits
    return np.asarray(jax.nn.log_softmax(logits[0, :len(ids)].astype(np.float32), -1),
                      np.float64)
  return run


@pytest.mark.slow
def test_echo_logprobs_are_the_base_models_and_the_first_token_is_its_top(server, tokenizer,
                                                                          base_log_probs):
  ids = tokenizer.encode(PROMPT)
  choice = _completion(server, prompt=PROMPT, max_tokens=1, echo=True, logprobs=3)
  lp = choice["logprobs"]
  (new_id,) = choice["token_ids"]
  assert choice["text"] == tokenizer.decode(ids) + tokenizer.decode([new_id])
  assert lp["tokens"] == [tokenizer.decode([i], skip_special=False) for i in ids + [new_id]]
  _check_offsets(choice["text"], lp)
  ref = base_log_probs(ids)                                               # [L, V]
  assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
  np.testing.assert_allclose(lp["token_logprobs"][1:len(ids)],
                             [ref[i - 1, t] for i, t in enumerate(ids) if i], atol=1e-5)
  for i in range(1, len(ids) + 1):                     # the prompt's tokens, then the new one
    top = lp["top_logprobs"][i]
    want = np.sort(ref[i - 1])[::-1][:3]
    np.testing.assert_allclose(sorted(top.values(), reverse=True), want, atol=1e-5)
  # Greedy: the generated token is the most likely one, with the engine's own log-prob.
  top = lp["top_logprobs"][-1]
  assert max(top, key=top.get) == lp["tokens"][-1]
  assert lp["token_logprobs"][-1] == pytest.approx(max(top.values()), abs=1e-4)


def test_logprobs_zero_gives_each_generated_tokens_own_log_prob(server, tiny_model, tokenizer):
  cfg, params = tiny_model
  ids = tokenizer.encode(PROMPT)
  choice = _completion(server, prompt=ids, max_tokens=6, logprobs=0, confidence=0.5)
  alone = Sampler(cfg, params, cache_length=CACHE_LENGTH, out_length=CACHE_LENGTH).decode(
      [ids], max_new_tokens=6, confidence=0.5, temperature=0.0)
  lp = choice["logprobs"]
  assert choice["token_ids"] == alone.tokens[0]
  assert lp["top_logprobs"] is None and len(lp["tokens"]) == len(alone.tokens[0])
  np.testing.assert_allclose(lp["token_logprobs"], alone.logprobs[0], atol=1e-6)
  _check_offsets(tokenizer.decode(ids) + choice["text"], lp)
  assert "logprobs" in choice and _completion(server, prompt=ids, max_tokens=2)["logprobs"] is None


def test_a_batch_of_prompts_gives_one_choice_each_as_if_sent_alone(server, tokenizer):
  prompts = ["hello the world", [7, 8, 9, 10], "a dog sat on the mat"]
  body = dict(prompt=prompts, max_tokens=1, echo=True, logprobs=2)
  r = _post(server, "/v1/completions", dict({"model": MODEL, "temperature": 0}, **body))
  assert r.status_code == 200, r.text
  out = r.json()
  assert [c["index"] for c in out["choices"]] == [0, 1, 2]
  for prompt, choice in zip(prompts, out["choices"]):
    alone = _completion(server, **dict(body, prompt=prompt))
    for key in ("text", "token_ids", "finish_reason"):
      assert choice[key] == alone[key]
    got, want = choice["logprobs"], alone["logprobs"]  # scored in one batch: float rounding
    assert (got["tokens"], got["text_offset"]) == (want["tokens"], want["text_offset"])
    np.testing.assert_allclose(got["token_logprobs"][1:], want["token_logprobs"][1:], atol=1e-5)
    for a, b in zip(got["top_logprobs"][1:], want["top_logprobs"][1:]):
      assert a.keys() == b.keys()
      np.testing.assert_allclose(list(a.values()), list(b.values()), atol=1e-5)
  sizes = [len(tokenizer.encode(p)) if isinstance(p, str) else len(p) for p in prompts]
  usage = out["usage"]
  assert usage["prompt_tokens"] == sum(sizes) and usage["completion_tokens"] == 3
  assert usage["hamburger"]["macro_steps"] == 3 and usage["hamburger"]["kv_entries"] == sum(sizes)
  r = _post(server, "/v1/completions", {"model": MODEL, "prompt": prompts, "stream": True})
  assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_prompt_scoring_compiles_once_per_length_bucket(tiny_model, tokenizer):
  cfg, params = tiny_model
  key = (cfg.base, f"top{SCORED_TOP}")
  before = TRACES[key]
  words = "the cat sat on a red mat".split()
  with serving(make_engine("continuous", cfg, params), cfg, tokenizer, "continuous") as server:
    for n, k in ((33, 1), (40, 4), (47, 2)):       # bucket 48, which no other test here fills
      prompt = " ".join(words[i % len(words)] for i in range(n))
      choice = _completion(server, prompt=prompt, max_tokens=1, echo=True, logprobs=k)
      assert len(choice["logprobs"]["top_logprobs"][-1]) == k
  assert TRACES[key] - before == 1               # whatever the N asked for


def test_token_id_server_offsets(tiny_model):
  cfg, params = tiny_model
  with serving(make_engine("serial", cfg, params), cfg, None) as server:
    for echo in (True, False):
      choice = _completion(server, prompt=[1, 15, 7], max_tokens=3, echo=echo, logprobs=0)
      text, lp = choice["text"], choice["logprobs"]
      assert text.startswith("1 15 7 ") == echo
      _check_offsets(("" if echo else "1 15 7 ") + text, lp)
      assert len(lp["tokens"]) == 3 * echo + len(choice["token_ids"])


def test_worker_call_runs_on_the_engine_thread_and_passes_errors_back(tiny_model):
  worker = EngineWorker(make_engine("serial", *tiny_model), capacity=2).start()

  async def calls():
    name = await worker.call(lambda: threading.current_thread().name)
    with pytest.raises(ZeroDivisionError):
      await worker.call(lambda: 1 / 0)
    return name
  assert asyncio.run(calls()) == "hamburger-engine"
  worker.close(timeout=30)

  async def too_late():
    return worker.call(lambda: 1)
  with pytest.raises(ShuttingDown):
    asyncio.run(too_late())


@pytest.mark.parametrize("fields, param", [
    (dict(logprobs=6, max_tokens=1), "logprobs"),
    (dict(logprobs=True, max_tokens=1), "logprobs"),
    (dict(logprobs=2, max_tokens=3), "logprobs"),
    (dict(echo=True, stream=True), "stream"),
    (dict(echo="yes"), "echo"),
])
def test_bad_logprobs_requests_are_400_naming_the_field(server, fields, param):
  r = _post(server, "/v1/completions", dict({"model": MODEL, "prompt": PROMPT}, **fields))
  assert r.status_code == 400, r.text
  assert r.json()["error"]["param"] == param


def test_chat_logprobs_through_the_openai_client(server, tiny_model, tokenizer, base_log_probs):
  client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
  messages = [{"role": "user", "content": "the cat sat on the"}]
  ids = tokenizer.encode(messages, chat=True)
  one = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1,
                                       temperature=0, logprobs=True, top_logprobs=3)
  [entry] = one.choices[0].logprobs.content
  want = np.sort(base_log_probs(ids)[-1])[::-1][:3]       # the base after the whole chat prompt
  np.testing.assert_allclose([t.logprob for t in entry.top_logprobs], want, atol=1e-5)
  assert entry.token == entry.top_logprobs[0].token
  assert entry.logprob == pytest.approx(want[0], abs=1e-4)
  assert bytes(entry.bytes).decode() == entry.token
  many = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5,
                                        temperature=0, logprobs=True,
                                        extra_body={"confidence": 0.5})
  cfg, params = tiny_model
  alone = Sampler(cfg, params, cache_length=CACHE_LENGTH, out_length=CACHE_LENGTH).decode(
      [ids], max_new_tokens=5, confidence=0.5, temperature=0.0,
      stop_ids=tuple(tokenizer.stop_ids(chat=True)))
  content = many.choices[0].logprobs.content
  assert [e.top_logprobs for e in content] == [[]] * len(alone.tokens[0])
  np.testing.assert_allclose([e.logprob for e in content], alone.logprobs[0], atol=1e-6)
  plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
  assert plain.choices[0].logprobs is None


def test_chat_logprobs_leave_out_a_final_end_of_turn_as_the_message_does(server, tokenizer):
  settings = protocol.parse_settings({"logprobs": True, "max_tokens": 4},
                                     protocol.Limits(max_tokens=8, default_max_tokens=8))
  end = tokenizer.stop_ids(chat=True)[0]                               # <|im_end|>: special
  lp = server.service.logprobs_object([5], None, [7, 8, end], [-1.0, -2.0, -3.0], settings,
                                      chat=True)
  assert [(e["token"], e["logprob"]) for e in lp["content"]] == [("cat", -1.0), ("sat", -2.0)]
  lp = server.service.logprobs_object([5], None, [7, 8], [-1.0, -2.0], settings, chat=True)
  assert len(lp["content"]) == 2


@pytest.mark.parametrize("fields, param", [
    (dict(top_logprobs=2, max_tokens=1), "top_logprobs"),
    (dict(logprobs=True, top_logprobs=21, max_tokens=1), "top_logprobs"),
    (dict(logprobs=True, top_logprobs=2, max_tokens=3), "top_logprobs"),
    (dict(logprobs=1), "logprobs"),
    (dict(logprobs=True, stream=True), "stream"),
    (dict(echo=True), "echo"),
])
def test_bad_chat_logprobs_requests_are_400_naming_the_field(server, fields, param):
  body = dict({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, **fields)
  r = _post(server, "/v1/chat/completions", body)
  assert r.status_code == 400, r.text
  assert r.json()["error"]["param"] == param


def test_tokenizer_endpoints(server, tiny_model, tokenizer):
  info = httpx2.get(server.url + "/tokenizer_info", timeout=30).json()
  eos = tiny_model[0].base.eos_token_ids[0]
  assert info["eos_token"] == tokenizer.decode([eos], skip_special=False)
  assert info["model_max_length"] == CACHE_LENGTH
  r = _post(server, "/tokenize", {"prompt": PROMPT, "add_special_tokens": False}).json()
  assert r["tokens"] == tokenizer.encode(PROMPT) and r["count"] == len(r["tokens"])
  assert _post(server, "/detokenize", {"tokens": r["tokens"]}).json()["prompt"] == PROMPT
  for path, body, param in (("/tokenize", {"prompt": 5}, "prompt"),
                            ("/detokenize", {"tokens": [1, 10**6]}, "tokens"),
                            ("/detokenize", {"tokens": "1 2"}, "tokens")):
    resp = _post(server, path, body)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param


@pytest.mark.slow
def test_lm_eval_log_likelihood_on_a_local_multiple_choice_task(tiny_model, tokenizer,
                                                                 base_log_probs, tmp_path):
  cfg, params = tiny_model
  with serving(make_engine("continuous", cfg, params), cfg, tokenizer, "continuous") as server:
    model_args = (f"model={MODEL},base_url={server.url}/v1/completions,"
                  "tokenizer_backend=remote,num_concurrent=2,max_retries=1")
    proc = run_lm_eval("local-completions", model_args, "hamburger_mc", str(tmp_path),
                       "--batch_size", "4")           # 4 prompts per request, scored together
  assert proc.returncode == 0, proc.stderr[-3000:]
  [results_file] = glob.glob(str(tmp_path / MODEL / "results_*.json"))
  with open(results_file) as f:
    assert 0.0 <= json.load(f)["results"]["hamburger_mc"]["acc,none"] <= 1.0
  [samples_file] = glob.glob(str(tmp_path / MODEL / "samples_hamburger_mc_*.jsonl"))
  with open(samples_file) as f:
    samples = [json.loads(line) for line in f]
  assert len(samples) == 20
  for s in samples[:3]:                 # each choice's log-likelihood is the base model's
    for args, [(loglik, _)] in zip(s["arguments"].values(), s["resps"]):
      context, continuation = args["arg_0"], args["arg_1"]
      ctx = tokenizer.encode(context, add_special_tokens=False)
      whole = ctx + tokenizer.encode(continuation, add_special_tokens=False)
      ref = base_log_probs(whole)
      want = sum(ref[i - 1, whole[i]] for i in range(len(ctx), len(whole)))
      assert float(loglik) == pytest.approx(want, abs=1e-4)


@pytest.mark.slow
def test_lm_eval_rolling_log_likelihood_on_a_local_perplexity_task(tiny_model, tokenizer,
                                                                  base_log_probs, tmp_path):
  cfg, params = tiny_model
  with serving(make_engine("continuous", cfg, params), cfg, tokenizer, "continuous") as server:
    model_args = (f"model={MODEL},base_url={server.url}/v1/completions,"
                  f"tokenizer_backend=remote,max_length={CACHE_LENGTH},max_retries=1")
    proc = run_lm_eval("local-completions", model_args, "hamburger_ppl", str(tmp_path),
                       "--batch_size", "4")
  assert proc.returncode == 0, proc.stderr[-3000:]
  [results_file] = glob.glob(str(tmp_path / MODEL / "results_*.json"))
  with open(results_file) as f:
    assert np.isfinite(json.load(f)["results"]["hamburger_ppl"]["word_perplexity,none"])
  [samples_file] = glob.glob(str(tmp_path / MODEL / "samples_hamburger_ppl_*.jsonl"))
  with open(samples_file) as f:
    samples = [json.loads(line) for line in f]
  assert len(samples) == 14
  eos = cfg.base.eos_token_ids[0]        # lm-eval's first window starts after the EOS token
  checked = 0
  for s in samples:
    text = s["arguments"]["gen_args_0"]["arg_0"]
    ids = [eos] + tokenizer.encode(text, add_special_tokens=False)
    if len(ids) > CACHE_LENGTH:           # longer texts are cut into several windows
      continue
    ref = base_log_probs(ids)
    want = sum(ref[i - 1, ids[i]] for i in range(1, len(ids)))
    assert float(s["resps"][0][0]) == pytest.approx(want, abs=1e-3)
    checked += 1
  assert checked >= 2


def test_text_offsets_with_smollm2s_tokenizer_follow_the_decoded_prefixes(tmp_path):
  """The running-length shortcut (byte-level BPE) gives what decoding every prefix gives."""
  from hamburger_jax.recipes import smollm2           # pylint: disable=import-outside-toplevel
  from hamburger_jax.text.tokenizer import Tokenizer  # pylint: disable=import-outside-toplevel
  tok = Tokenizer(smollm2.write_tokenizer(str(tmp_path)))
  service = Service(None, MODEL, tokenizer=tok, vocab_size=tok.vocab_size, max_prompt_len=64,
                    limits=protocol.Limits(max_tokens=8, default_max_tokens=8),
                    request_timeout=1.0)
  for text in ("The capital of France is Paris.", "def f(x):\n    return x  # ok",
               "Café ünïcode <|im_end|> ✓"):
    ids = tok.encode(text)
    texts = [service.token_text(i) for i in ids]
    for skip in (False, True):
      want, at = [], 0
      for i, t in enumerate(texts):
        end = len(tok.decode(ids[:i + 1], skip_special=skip))
        at = min(max(end - len(t), at), end)
        want.append(at)
      assert service._starts(ids, texts, skip) == want      # pylint: disable=protected-access
