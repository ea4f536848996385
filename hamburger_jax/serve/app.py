"""The HTTP side: a FastAPI app with OpenAI's completion routes over a `Service`.

    app = create_app(service)      # then uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: POST /v1/chat/completions, POST /v1/completions (one prompt, or a batch of them with one
choice each; both streamed with "stream": true, one prompt), GET /v1/models, GET /health (200
while serving, 503 while shutting down), and the tokenizer in vLLM's shapes (GET
/tokenizer_info, POST /tokenize, POST /detokenize: lm-eval's "remote" tokenizer, so its
log-likelihood tasks run against /v1/completions with no tokenizer download).
Errors are OpenAI error objects: 400 bad request, 404 unknown model or route, 408 request
timeout, 503 queue full (with Retry-After) or shutting down. A request whose client hangs up is
cancelled. The engine worker starts and stops with the app's lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import fastapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from hamburger_jax.serve import protocol
from hamburger_jax.serve.protocol import ApiError
from hamburger_jax.serve.responses import DONE, Formatter, sse
from hamburger_jax.serve.service import Run, Service, merged_usage


def _error_response(e: ApiError) -> JSONResponse:
  return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


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
        text = service.prompt_text(prompt_ids) + text
      lp = service.logprobs_object(list(prompt_ids), scores, ids, logprobs, settings, fmt.chat)
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
  body = protocol.parse_body(await request.body())
  protocol.check_model(body, service.model_id)
  settings = protocol.parse_settings(body, service.limits, chat)
  if chat:
    prompts = [service.encode_chat(protocol.chat_messages(body))]
  else:
    prompts = [service.encode_completion(p) for p in protocol.completion_prompts(body)]
  if settings.stream and len(prompts) > 1:
    raise ApiError(400, "A streamed request takes one prompt: send the others separately.",
                   "prompt")
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


def create_app(service: Service) -> fastapi.FastAPI:
  """The ASGI app; its lifespan starts the engine worker and closes it at shutdown."""

  @contextlib.asynccontextmanager
  async def lifespan(app):
    service.worker.start()
    yield
    service.worker.close()

  app = fastapi.FastAPI(title="HAMburger", lifespan=lifespan, docs_url=None, redoc_url=None)
  app.state.service = service

  @app.exception_handler(ApiError)
  async def _api_error(request, e: ApiError):
    return _error_response(e)

  @app.exception_handler(HTTPException)
  async def _http_error(request, e: HTTPException):
    kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
    return _error_response(ApiError(e.status_code, f"{request.method} {request.url.path}: "
                                                   f"{e.detail}", kind=kind))

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
    return service.tokenizer_info()

  @app.post("/tokenize")
  async def tokenize(request: fastapi.Request):
    return service.tokenize(protocol.parse_body(await request.body()))

  @app.post("/detokenize")
  async def detokenize(request: fastapi.Request):
    return service.detokenize(protocol.parse_body(await request.body()))

  @app.get("/health")
  async def health():
    info = service.health()
    return JSONResponse(info, status_code=503 if service.draining else 200)

  return app
