"""The HTTP side: a FastAPI app with OpenAI's completion routes over a `Service`.

    app = create_app(service)      # then uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: POST /v1/chat/completions, POST /v1/completions (one prompt, or a batch of them with one
choice each; both streamed with "stream": true, one prompt), GET /v1/models, GET /health (200
while serving, 503 while shutting down), and the tokenizer in vLLM's shapes (GET
/tokenizer_info, POST /tokenize, POST /detokenize: lm-eval's "remote" tokenizer, so its
log-likelihood tasks run against /v1/completions with no tokenizer download).
Errors are OpenAI error objects: 400 bad request (invalid JSON or text, nesting too deep), 404
unknown model or route, 408 request timeout, 413 body over `max_body_bytes`, 503 queue full (with
Retry-After) or shutting down, and 500 for anything unforeseen (never a plain-text body). Request
bodies are parsed and tokenized on the service's text thread, so /health answers while a large
request is worked on. A request whose client hangs up is cancelled, without a traceback in the
log. The engine worker starts and stops with the app's lifespan; `http.uvicorn_options()` adds the
connection-level guards (read timeouts, half-closed clients).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import fastapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from hamburger_jax.serve import protocol
from hamburger_jax.serve.protocol import ApiError
from hamburger_jax.serve.responses import DONE, Formatter, merged_usage, sse
from hamburger_jax.serve.service import Run, Service

MAX_BODY_BYTES = 4 * 2**20       # default request-body limit (413 above it)
_DRAIN_FACTOR = 4                # an oversized body is read (and dropped) up to this many limits,
                                 # so that its client sees the 413 rather than a reset connection
_log = logging.getLogger(__name__)


def _render(content) -> bytes:
  """JSON with non-ASCII escaped: any text a client sent (lone surrogates too) renders."""
  return json.dumps(content, separators=(",", ":")).encode("ascii")


class _AsciiJson(JSONResponse):
  """A JSONResponse rendered by `_render`."""

  def render(self, content) -> bytes:
    return _render(content)


def _error_response(e: ApiError) -> JSONResponse:
  return _AsciiJson(e.body(), status_code=e.status, headers=e.headers)


async def _rendered_off_loop(service: Service, fn) -> Response:
  """The JSON response of fn(), computed and rendered on the service's text thread (a /tokenize
  answer can hold a million ids)."""
  body = await service.off_loop(lambda: _render(fn()))
  return Response(body, media_type="application/json")


async def read_body(request: fastapi.Request) -> bytes:
  """The request body; ApiError 413 once it passes the app's `max_body_bytes` (the rest is read
  and dropped up to _DRAIN_FACTOR times the limit, then the connection is left to close)."""
  limit = request.app.state.max_body_bytes
  declared = request.headers.get("content-length", "")
  size, chunks = 0, []
  if not (declared.isdigit() and int(declared) > limit * _DRAIN_FACTOR):
    async for chunk in request.stream():
      size += len(chunk)
      if size > limit * _DRAIN_FACTOR:
        break
      if size <= limit:
        chunks.append(chunk)
  if size > limit or (declared.isdigit() and int(declared) > limit):
    raise ApiError(413, f"The request body is larger than this server's limit of {limit} "
                        "bytes: send a shorter request.", code="request_too_large")
  return b"".join(chunks)


async def _choice(run: Run, fmt: Formatter, index: int, prompt_ids, scores) -> tuple:
  """-> (choice, usage) of one prompt's run; with echo the prompt's text comes first; log-probs
  from the pieces and `scores` (one entry of `Service.score_prompts`, or None)."""
  texts, ids, logprobs = [], [], []
  async for piece in run.pieces():
    texts.append(piece.text)
    ids.extend(piece.token_ids)
    logprobs.extend(piece.logprobs)
    if piece.finish_reason is not None:
      settings, service = run.settings, run.service
      text = "".join(texts)
      if settings.echo:
        text = await service.off_loop(service.prompt_text, prompt_ids) + text
      lp = await service.off_loop(service.logprobs_object, list(prompt_ids), scores, ids,
                                  logprobs, settings, fmt.chat)
      return fmt.choice(text, ids, piece.finish_reason, lp, index), piece.usage
  raise RuntimeError("The request ended without a finish reason.")


async def _collect(runs: list[Run], fmt: Formatter, prompts, scores) -> dict:
  """The whole response: one choice per prompt, in order; the usage summed."""
  parts = await asyncio.gather(*(_choice(run, fmt, i, ids, sc) for i, (run, ids, sc)
                                 in enumerate(zip(runs, prompts, scores))))
  usages = [u for _, u in parts]
  return fmt.full([c for c, _ in parts], usages[0] if len(usages) == 1 else merged_usage(usages))


_DISCONNECT_POLL_S = 0.5   # how often a non-streamed request checks that its client is still there


async def _collect_while_connected(request: fastapi.Request, runs: list[Run], fmt: Formatter,
                                   *args):
  """`_collect(runs, fmt, *args)`, or None once the client has hung up (the runs are cancelled
  either way)."""
  collect = asyncio.ensure_future(_collect(runs, fmt, *args))
  try:
    while True:
      done, _ = await asyncio.wait({collect}, timeout=_DISCONNECT_POLL_S)
      if done:
        return collect.result()
      if await request.is_disconnected():
        return None
  finally:
    collect.cancel()
    for run in runs:
      run.cancel()


async def _stream(run: Run, fmt: Formatter):
  """SSE chunks, then [DONE]; an error after the first byte is sent as an error event."""
  first = True
  try:
    async for piece in run.pieces():
      if piece.text or piece.finish_reason or first:
        yield sse(fmt.chunk(piece.text, piece.token_ids, piece.finish_reason, first))
        first = False
      if piece.finish_reason is not None and run.settings.include_usage:
        yield sse(fmt.usage_chunk(piece.usage))
  except ApiError as e:
    yield sse(e.body())
  yield DONE


class _RunStream(StreamingResponse):
  """The SSE response of `run`; cancels `run` however the response ends.

  A client that hangs up ends the response at a `send`, with the body generator suspended;
  cancelling here does not wait for that generator to be garbage-collected.
  """

  def __init__(self, run: Run, fmt: Formatter):
    super().__init__(_stream(run, fmt), media_type="text/event-stream",
                     headers={"Cache-Control": "no-cache"})
    self.run = run

  async def __call__(self, scope, receive, send):
    try:
      await super().__call__(scope, receive, send)
    finally:
      self.run.cancel()


async def _complete(request: fastapi.Request, chat: bool):
  service: Service = request.app.state.service
  settings, prompts = await service.off_loop(service.prepare, await read_body(request), chat)
  runs = service.start_all(prompts, settings, chat)
  fmt = Formatter(chat, service.model_id)
  if settings.stream:
    return _RunStream(runs[0], fmt)
  scores = [None] * len(prompts)
  if settings.logprobs is not None and (settings.echo or settings.logprobs):
    try:                            # beside the admitted requests, within their deadline
      scores = await service.score_prompts(prompts, runs[0].deadline - time.monotonic())
    except BaseException:
      for run in runs:
        run.cancel()
      raise
  body = await _collect_while_connected(request, runs, fmt, prompts, scores)
  if body is None:                  # nobody is listening; the status is only logged
    return Response(status_code=499)
  return JSONResponse(body)


def _install_error_handlers(app: fastapi.FastAPI) -> None:
  """Every failure answers with an OpenAI error object (never a plain-text 500)."""

  @app.exception_handler(ApiError)
  async def _api_error(request, e: ApiError):
    return _error_response(e)

  @app.exception_handler(ClientDisconnect)
  async def _gone(request, e):                 # hung up mid-body: nobody to answer, no traceback
    _log.info("%s %s: the client hung up before sending the whole body.", request.method,
              request.url.path)
    return Response(status_code=499)

  @app.exception_handler(Exception)
  async def _unforeseen(request, e: Exception):   # logged with its traceback by the server
    return _error_response(ApiError(500, f"The server failed on this request "
                                         f"({type(e).__name__}).", kind="server_error"))

  @app.exception_handler(HTTPException)
  async def _http_error(request, e: HTTPException):
    kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
    return _error_response(ApiError(e.status_code, f"{request.method} {request.url.path}: "
                                                   f"{e.detail}", kind=kind))


def create_app(service: Service, max_body_bytes: int = MAX_BODY_BYTES) -> fastapi.FastAPI:
  """The ASGI app; its lifespan starts the engine worker and closes it (and the service's text
  thread) at shutdown. Request bodies over `max_body_bytes` are answered 413."""

  @contextlib.asynccontextmanager
  async def lifespan(app):
    service.worker.start()
    yield
    service.worker.close()
    service.close()

  app = fastapi.FastAPI(title="HAMburger", lifespan=lifespan, docs_url=None, redoc_url=None)
  app.state.service, app.state.max_body_bytes = service, max_body_bytes

  _install_error_handlers(app)

  @app.post("/v1/chat/completions")
  async def chat_completions(request: fastapi.Request):
    return await _complete(request, chat=True)

  @app.post("/v1/completions")
  async def completions(request: fastapi.Request):
    return await _complete(request, chat=False)

  @app.get("/v1/models")
  async def models():
    return {"object": "list", "data": [{"id": service.model_id, "object": "model",
                                        "created": 0, "owned_by": "hamburger_jax"}]}

  @app.get("/tokenizer_info")
  async def tokenizer_info():
    return await _rendered_off_loop(service, service.tokenizer_info)

  @app.post("/tokenize")
  async def tokenize(request: fastapi.Request):
    raw = await read_body(request)
    return await _rendered_off_loop(service, lambda: service.tokenize(protocol.parse_body(raw)))

  @app.post("/detokenize")
  async def detokenize(request: fastapi.Request):
    raw = await read_body(request)
    return await _rendered_off_loop(service,
                                    lambda: service.detokenize(protocol.parse_body(raw)))

  @app.get("/health")
  async def health():
    info = service.health()
    return JSONResponse(info, status_code=503 if service.draining else 200)

  return app
