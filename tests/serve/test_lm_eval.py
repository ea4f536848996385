"""lm-eval's `local-chat-completions` model against the server, offline, on the local task
benchmarks/lm_eval_tasks/hamburger_qa (a JSONL file in the repo): it runs to the end, and every
answer it recorded is what the server gives for the same request."""

from __future__ import annotations

import glob
import json

import openai
import pytest

from tests.serve.conftest import MODEL, make_engine, run_lm_eval, serving


@pytest.fixture(scope="module")
def default_server(tiny_model, tokenizer):
  cfg, params = tiny_model
  kind = "continuous"                                   # the default engine
  with serving(make_engine(kind, cfg, params), cfg, tokenizer, kind) as server:
    yield server


@pytest.mark.slow
def test_lm_eval_chat_completions_on_a_local_task(default_server, tmp_path):
  model_args = (f"model={MODEL},base_url={default_server.url}/v1/chat/completions,"
                "num_concurrent=4,max_retries=1")
  proc = run_lm_eval("local-chat-completions", model_args, "hamburger_qa", str(tmp_path),
                     "--apply_chat_template")
  assert proc.returncode == 0, proc.stderr[-3000:]
  [results_file] = glob.glob(str(tmp_path / MODEL / "results_*.json"))
  with open(results_file) as f:
    results = json.load(f)["results"]["hamburger_qa"]
  assert 0.0 <= results["contains_answer,none"] <= 1.0
  [samples_file] = glob.glob(str(tmp_path / MODEL / "samples_hamburger_qa_*.jsonl"))
  with open(samples_file) as f:
    samples = [json.loads(line) for line in f]
  assert len(samples) == 20
  client = openai.OpenAI(base_url=default_server.url + "/v1", api_key="unused", max_retries=0)
  for s in samples[:5]:
    messages = json.loads(s["arguments"]["gen_args_0"]["arg_0"][0])
    gen = s["arguments"]["gen_args_0"]["arg_1"]
    assert messages[-1]["content"].startswith(s["doc"]["question"])
    out = client.chat.completions.create(model=MODEL, messages=messages, seed=1234,
                                         max_tokens=gen["max_gen_toks"], stop=gen["until"],
                                         temperature=gen["temperature"])
    assert s["resps"][0][0] == out.choices[0].message.content
