"""One request's life on the server side: prompt -> engine request -> text pieces with usage.

    service = Service(worker, "hamburger-smollm2", tokenizer=tok, vocab_size=49152, ...)
    settings, prompts = await service.off_loop(service.prepare, raw_body, True)   # chat
    ids = service.encode_chat(messages)                  # or encode_completion(prompt)
    run = service.start(ids, settings, chat=True)        # ApiError 503 when the queue is full
    async for piece in run.pieces():                     # Piece(text, token_ids, finish, usage)
      ...
    scores = await service.score_prompts([ids], timeout_s)   # echo / most likely tokens
    service.logprobs_object(ids, scores, piece_ids, piece_logprobs, settings, chat)

Never calls JAX: the engine lives on the worker's thread. Parsing, tokenizing and the texts of
log-probs run on one text thread (`off_loop`), so that no request holds up the event loop (and
/health); one thread, because the tokenizer switches its special-token parsing per call. Prompt
text of more than `chars_per_token` characters per token of the KV buffer is refused before it is
tokenized (context_length_exceeded): a bound several times what text averages per token, so that
no request makes the server tokenize megabytes only to refuse them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import itertools
import time
from typing import AsyncIterator, Sequence

from hamburger_jax.serve import protocol, responses
from hamburger_jax.serve.engines import ModeRequest
from hamburger_jax.serve.protocol import ApiError, Limits, Settings
from hamburger_jax.serve.responses import usage
from hamburger_jax.serve.text import TextOutput
from hamburger_jax.serve.worker import EngineWorker, Failure, QueueFull, ShuttingDown

_POLL_S = 0.5           # how often a waiting request rechecks its deadline
# Most likely tokens every prompt scoring lists (the most a request may ask): one compile per
# prompt length bucket and power-of-two count of prompts, whatever a request's N.
SCORED_TOP = protocol.MAX_TOP_LOGPROBS
_RETRY_AFTER_S = "1"
CHARS_PER_TOKEN = 16              # prompt characters per context token refused before tokenizing
MAX_TOKENIZE_CHARS = 1_000_000    # /tokenize: longest text (documents may exceed the context)
# The engine's finish reasons in OpenAI's words.
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "buffer_full": "length"}


@dataclasses.dataclass
class Piece:
  """New output of one request; the last piece has finish_reason and usage set."""
  text: str
  token_ids: list[int]
  finish_reason: str | None = None
  usage: dict | None = None
  logprobs: list[float] = dataclasses.field(default_factory=list)   # the model's, of token_ids


class Service:
  """What the HTTP routes call: encoding, admission, and the per-request event stream."""

  def __init__(self, worker: EngineWorker, model_id: str, *, tokenizer, vocab_size: int,
               max_prompt_len: int, limits: Limits, request_timeout: float,
               system: str | None = None, engine_name: str = "",
               fence_ids: tuple[int, ...] = (), chars_per_token: int = CHARS_PER_TOKEN,
               max_tokenize_chars: int = MAX_TOKENIZE_CHARS):
    self.worker, self.model_id, self.tokenizer = worker, model_id, tokenizer
    self.vocab_size, self.max_prompt_len, self.limits = vocab_size, max_prompt_len, limits
    self.chars_per_token, self.max_tokenize_chars = chars_per_token, max_tokenize_chars
    self._text_thread = concurrent.futures.ThreadPoolExecutor(1, "hamburger-text")
    self.request_timeout = request_timeout
    self.system, self.engine_name = system, engine_name
    self.fence_ids = tuple(fence_ids)    # code fences: fenced code decodes one token per step
    self.chat_stop_ids = tuple(tokenizer.stop_ids(chat=True)) if tokenizer is not None else ()
    self.draining = False
    self.drain_deadline: float | None = None      # time.monotonic() when draining requests are answered

  # -- off the event loop --

  async def off_loop(self, fn, *args):
    """fn(*args) on the text thread; the event loop serves other requests meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(
        self._text_thread, functools.partial(fn, *args))

  def close(self) -> None:
    """Stops the text thread (work not started yet is dropped)."""
    self._text_thread.shutdown(wait=False, cancel_futures=True)

  # -- prompts --

  def prepare(self, raw: bytes, chat: bool) -> tuple[Settings, list[list[int]]]:
    """A completion request's body -> (settings, prompt ids per prompt); ApiError when it cannot
    be served. CPU work: call it through `off_loop`."""
    body = protocol.parse_body(raw)
    protocol.check_model(body, self.model_id)
    settings = protocol.parse_settings(body, self.limits, chat)
    if chat:
      return settings, [self.encode_chat(protocol.chat_messages(body))]
    prompts = protocol.completion_prompts(body)
    if settings.stream and len(prompts) > 1:
      raise ApiError(400, "A streamed request takes one prompt: send the others separately.",
                     "prompt")
    return settings, [self.encode_completion(p) for p in prompts]

  def _check_length(self, chars: int, param: str) -> None:
    """ApiError context_length_exceeded for text too long to fit, before tokenizing it."""
    limit = self.chars_per_token * self.max_prompt_len
    if chars > limit:
      raise ApiError(400, f"The prompt has {chars} characters, more than fit in the "
                          f"{self.max_prompt_len}-token KV buffer ({limit} characters at "
                          f"{self.chars_per_token} per token): shorten it.", param,
                     code="context_length_exceeded")

  def encode_chat(self, messages: list[dict]) -> list[int]:
    if self.tokenizer is None:
      raise ApiError(400, "This server has no tokenizer: send token-id prompts to "
                          "/v1/completions.", "messages")
    if len(messages) > self.max_prompt_len:        # every message takes a token or more
      raise ApiError(400, f"'messages' holds {len(messages)} messages, more than the "
                          f"{self.max_prompt_len} tokens of the KV buffer: send fewer.",
                     "messages", code="context_length_exceeded")
    self._check_length(sum(len(m["content"]) for m in messages), "messages")
    try:
      ids = self.tokenizer.encode(messages, chat=True, system=self.system)
    except ValueError as e:                    # TokenizerError: no chat template, bad message
      raise ApiError(400, str(e), "messages") from e
    return self.check_prompt(ids, "messages")

  def encode_completion(self, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
      if self.tokenizer is None:
        raise ApiError(400, "This server has no tokenizer: give 'prompt' as a list of token "
                            "ids.", "prompt")
      self._check_length(len(prompt), "prompt")
      prompt = self.tokenizer.encode(prompt)
    return self.check_prompt(prompt, "prompt")

  def check_prompt(self, ids: Sequence[int], param: str) -> list[int]:
    ids = [int(i) for i in ids]
    if not ids:
      raise ApiError(400, "The prompt encodes to no tokens.", param)
    if len(ids) > self.max_prompt_len:
      raise ApiError(400, f"The prompt has {len(ids)} tokens but the KV buffer holds "
                          f"{self.max_prompt_len}: shorten it.", param,
                     code="context_length_exceeded")
    bad = [i for i in ids if not 0 <= i < self.vocab_size]
    if bad:
      raise ApiError(400, f"Token id {bad[0]} is outside the vocabulary "
                          f"(0..{self.vocab_size - 1}).", param)
    return ids

  # -- running --

  def start(self, prompt_ids: list[int], settings: Settings, chat: bool) -> "Run":
    """Submits the request (ApiError 503 with Retry-After when it cannot be queued)."""
    if settings.stop and self.tokenizer is None:
      raise ApiError(400, "'stop' strings need a tokenizer; this server has none.", "stop")
    if self.draining:
      raise ApiError(503, "The server is shutting down.", kind="server_error",
                     code="shutting_down")
    request = ModeRequest(
        prompt_ids=prompt_ids, max_new_tokens=settings.max_tokens,
        confidence=settings.confidence, min_token_prob=settings.min_token_prob,
        temperature=settings.temperature, top_k=settings.top_k,
        top_p=settings.top_p, seed=settings.seed, stop_ids=self.chat_stop_ids if chat else (),
        fence_ids=self.fence_ids, verify=settings.verify)
    try:
      ticket = self.worker.submit(request, asyncio.get_running_loop())
    except QueueFull as e:
      raise ApiError(503, f"{e} Retry shortly.", kind="server_error", code="queue_full",
                     headers={"Retry-After": _RETRY_AFTER_S}) from e
    except ShuttingDown as e:
      raise ApiError(503, str(e), kind="server_error", code="shutting_down") from e
    return Run(self, ticket, len(prompt_ids), settings, time.monotonic() + self.request_timeout)

  def start_all(self, prompts: Sequence[list[int]], settings: Settings,
                chat: bool) -> list["Run"]:
    """`start` for each prompt; if one cannot start, the ones started are cancelled."""
    runs: list[Run] = []
    try:
      for ids in prompts:
        runs.append(self.start(ids, settings, chat))
    except BaseException:
      for run in runs:
        run.cancel()
      raise
    return runs

  # -- the tokenizer over HTTP (/tokenizer_info, /tokenize, /detokenize: vLLM's shapes) --

  def _need_tokenizer(self, param: str):
    if self.tokenizer is None:
      raise ApiError(400, "This server has no tokenizer (it serves token ids).", param)
    return self.tokenizer

  def tokenizer_info(self) -> dict:
    """eos_token: the first EOS id's text; bos_token: the token that plain-text encoding puts
    first on its own (None if it adds none)."""
    tok = self._need_tokenizer(None)
    eos = self.worker.engine.eos_ids
    bos = tok.encode("", add_special_tokens=True)
    return {"eos_token": self.token_text(eos[0]) if eos else None,
            "bos_token": self.token_text(bos[0]) if bos else None, "pad_token": None,
            "model_max_length": self.max_prompt_len}

  def tokenize(self, body: dict) -> dict:
    tok = self._need_tokenizer("prompt")
    prompt, special = body.get("prompt"), body.get("add_special_tokens", True)
    if not isinstance(prompt, str):
      raise ApiError(400, f"'prompt' must be a string, got {protocol.brief(prompt)}.", "prompt")
    if not isinstance(special, bool):
      raise ApiError(400, f"'add_special_tokens' must be true or false, got "
                          f"{protocol.brief(special)}.", "add_special_tokens")
    if len(protocol.check_text(prompt, "prompt")) > self.max_tokenize_chars:
      raise ApiError(400, f"'prompt' has {len(prompt)} characters; /tokenize takes at most "
                          f"{self.max_tokenize_chars}.", "prompt")
    ids = tok.encode(prompt, add_special_tokens=special)
    return {"tokens": ids, "count": len(ids), "max_model_len": self.max_prompt_len}

  def detokenize(self, body: dict) -> dict:
    tok = self._need_tokenizer("tokens")
    ids = body.get("tokens")
    if not (isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                          for i in ids)):
      raise ApiError(400, f"'tokens' must be a list of token ids, got {protocol.brief(ids)}.",
                     "tokens")
    bad = [i for i in ids if not 0 <= i < self.vocab_size]
    if bad:
      raise ApiError(400, f"Token id {bad[0]} is outside the vocabulary "
                          f"(0..{self.vocab_size - 1}).", "tokens")
    return {"prompt": tok.decode(ids)}

  # -- log-probs (echo / logprobs) --

  def token_text(self, token_id: int) -> str:
    if self.tokenizer is None:
      return str(token_id)
    return self.tokenizer.decode([token_id], skip_special=False)

  def prompt_text(self, prompt_ids: Sequence[int]) -> str:
    """The prompt as `echo` puts it before the completion's text (special tokens written out)."""
    if self.tokenizer is None:
      return "".join(f"{i} " for i in prompt_ids)        # ids, as a token-id server writes them
    return self.tokenizer.decode(prompt_ids, skip_special=False)

  def _starts(self, ids: Sequence[int], texts: Sequence[str], skip_special: bool) -> list[int]:
    """Where each token's text (`texts`, from `token_text`) starts in the rendering of `ids` (ids
    joined by spaces without a tokenizer): decoding ids[:i + 1] ends with token i's text (a
    special token that the rendering skips gets the offset of what follows). When the rendering
    is just the texts one after another (byte-level BPE on whole characters), their running
    lengths, without decoding every prefix."""
    if self.tokenizer is None:
      lengths = [len(str(i)) + 1 for i in ids]
    elif ("\ufffd" not in "".join(texts)
          and self.tokenizer.decode(ids, skip_special=skip_special) == "".join(texts)):
      lengths = [len(t) for t in texts]
    else:
      lengths = None
    if lengths is not None:
      return list(itertools.accumulate(lengths[:-1], initial=0))[:len(ids)]
    starts, at = [], 0
    for i, text in enumerate(texts):
      end = len(self.tokenizer.decode(ids[:i + 1], skip_special=skip_special))
      at = min(max(end - len(text), at), end)
      starts.append(at)
    return starts

  def _text_offsets(self, prompt_ids: Sequence[int], generated: Sequence[int],
                    texts: Sequence[str], echo: bool) -> list[int]:
    """Each listed token's character offset in the response text (counted from the prompt's
    start, as OpenAI's are); texts: the listed tokens' (the prompt's with echo, then the
    generated ones)."""
    start, n = len(self.prompt_text(prompt_ids)), len(prompt_ids) if echo else 0
    return ((self._starts(prompt_ids, texts[:n], skip_special=False) if echo else [])
            + [start + at for at in self._starts(generated, texts[n:], skip_special=True)])

  async def score_prompts(self, prompts: Sequence[list[int]], timeout_s: float) -> list:
    """Per prompt (log p of each token [L], the SCORED_TOP most likely next tokens after each
    position: ids and log-probs [L, SCORED_TOP]), computed together on the engine thread between
    engine steps (`Scorer.top_log_probs`); ApiError 408 after timeout_s, 500 if it fails."""
    scorer = self.worker.engine.scorer
    try:
      return await asyncio.wait_for(
          self.worker.call(lambda: scorer.top_log_probs(list(prompts), SCORED_TOP)),
          max(timeout_s, 0.0))
    except ShuttingDown as e:
      raise ApiError(503, str(e), kind="server_error", code="shutting_down") from e
    except asyncio.TimeoutError as e:
      raise ApiError(408, f"Scoring the prompt took longer than the server's timeout of "
                          f"{self.request_timeout:g} s.", kind="timeout",
                     code="request_timeout") from e
    except Exception as e:  # pylint: disable=broad-except
      raise ApiError(500, f"Scoring the prompt failed: {e}", kind="server_error") from e

  def _top(self, ids, logps) -> dict[str, float]:
    top: dict[str, float] = {}
    for i, lp in zip(ids.tolist(), logps.tolist()):
      top.setdefault(self.token_text(i), lp)        # tokens that read the same: the likelier
    return top

  def logprobs_object(self, prompt_ids: list[int], scores, generated: list[int],
                      generated_logprobs: list[float], settings: Settings,
                      chat: bool) -> dict | None:
    """OpenAI's `logprobs` of a response (None without log-probs): a text completion's covers
    the prompt too with echo (`responses.completion_logprobs`), a chat completion's the generated
    tokens but a final end of turn, which its message leaves out (`responses.chat_logprobs`).
    Generated tokens: all the engine produced (past the cut of a stop string too). scores:
    `score_prompts`' entry, when echo or N >= 1."""
    k = settings.logprobs
    if k is None:
      return None
    tokens, values, top = [], [], []
    if settings.echo:
      prompt_logp, top_ids, top_logp = scores
      tokens += [self.token_text(i) for i in prompt_ids]
      values += [None] + [float(x) for x in prompt_logp[1:]]
      top += [None] + [self._top(top_ids[i - 1, :k], top_logp[i - 1, :k])
                       for i in range(1, len(prompt_ids))]
    tokens += [self.token_text(i) for i in generated]
    values += [float(x) for x in generated_logprobs]
    if k and generated:                              # max_tokens is 1 (parse_settings)
      _, top_ids, top_logp = scores
      top.append(self._top(top_ids[-1, :k], top_logp[-1, :k]))
    if chat:
      top = top if k else [{}] * len(tokens)
      ends = set(self.chat_stop_ids) | set(self.worker.engine.eos_ids)
      hidden_end = (bool(generated) and generated[-1] in ends
                    and not self.tokenizer.decode(generated[-1:]))  # the message skips it
      keep = len(tokens) - hidden_end
      return responses.chat_logprobs(tokens[:keep], values[:keep], top[:keep])
    return responses.completion_logprobs(tokens, values, top if k else None,
                                         self._text_offsets(prompt_ids, generated, tokens,
                                                            settings.echo))

  def start_draining(self, grace_s: float) -> None:
    """New requests get 503; running ones are answered at the latest `grace_s` from now."""
    self.draining = True
    self.drain_deadline = time.monotonic() + grace_s

  def health(self) -> dict:
    return {"status": "draining" if self.draining else "ok", "model": self.model_id,
            "engine": self.engine_name, "modes": self.limits.modes.names(),
            "default_mode": self.limits.modes.default_name(), "pending": self.worker.pending,
            "capacity": self.worker.capacity, **self.worker.stats}


class Run:
  """One submitted request: `pieces()` yields its output until it finishes."""

  def __init__(self, service: Service, ticket, prompt_tokens: int, settings: Settings,
               deadline: float):
    self.service, self.ticket, self.prompt_tokens = service, ticket, prompt_tokens
    self.settings, self.deadline = settings, deadline
    self.text = TextOutput(service.tokenizer, settings.stop)

  async def _next_item(self):
    """The next engine item, or ApiError once the request timeout (or the drain) has passed."""
    while True:
      drain, now = self.service.drain_deadline, time.monotonic()
      if now >= self.deadline:
        raise ApiError(408, f"The request took longer than the server's timeout of "
                            f"{self.service.request_timeout:g} s.", kind="timeout",
                       code="request_timeout")
      if drain is not None and now >= drain:
        raise ApiError(503, "The server shut down before this request finished.",
                       kind="server_error", code="shutting_down")
      try:
        return await asyncio.wait_for(self.ticket.queue.get(), _POLL_S)
      except asyncio.TimeoutError:
        continue

  async def pieces(self) -> AsyncIterator[Piece]:
    finished = False
    try:
      while not finished:
        item = await self._next_item()
        if isinstance(item, Failure):
          raise ApiError(item.status, item.message,
                         kind="invalid_request_error" if item.status < 500 else "server_error")
        text, stopped = self.text.add(item.new_tokens, final=item.finished)
        finished = item.finished or stopped
        if not finished:
          yield Piece(text, list(item.new_tokens), logprobs=list(item.logprobs))
          continue
        reason = "stop" if stopped else FINISH.get(item.finish_reason, "stop")
        yield Piece(text, list(item.new_tokens), reason,
                    usage(self.prompt_tokens, item.tokens, item.macro_steps,
                          self.settings.verify),
                    list(item.logprobs))
    finally:
      self.cancel()                             # timeout, drain, stop string, error

  def cancel(self) -> None:
    """Stops decoding this request if it is still running (any number of calls)."""
    if not self.ticket.done:
      self.service.worker.cancel(self.ticket)
