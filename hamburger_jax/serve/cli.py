"""The library side of `serve.py` / `python -m hamburger_jax.serve`: load, build, serve.

    python -m hamburger_jax.serve --ckpt smollm2 --port 8000
    python serve.py --ckpt /tmp/tiny_ckpt --token_ids --engine serial

Checkpoints load with `decode.checkpoint.open_checkpoint`, as in decode.py (`--ckpt smollm2` is
the shipped model with its tokenizer and system prompt). Bad arguments exit with code 2 and one line on stderr. SIGTERM (or Ctrl-C) stops
taking connections, answers new requests on open ones with 503, lets running requests finish for
up to --shutdown_timeout seconds (then answers them with an error) and exits with code 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import signal
import socket
import sys
import time
from typing import Sequence

from hamburger_jax.convert import CheckpointError
from hamburger_jax.decode.checkpoint import (apply_quantize, check_cpu_dots, check_draft_branches,
                                             check_lookup_drafts, lookup_setting, width_rule,
                                             check_kv_cache, check_quantize, check_verify_steps,
                                             checkpoint_dir, code_fence_ids,
                                             load_verify_drafter, open_checkpoint, resolve_knobs,
                                             verify_calibration, verify_drafter_steps)
from hamburger_jax.decode.prompts import UsageError
from hamburger_jax.decode import verify
from hamburger_jax.decode.mesh import make_decode_mesh, parse_mesh
from hamburger_jax.decode.sampler import DecodeInputError
from hamburger_jax.decode import persistent_cache
from hamburger_jax.model import cpu_dots
from hamburger_jax.model.config import HamburgerConfig
from hamburger_jax.serve import app as app_limits
from hamburger_jax.serve import engines
from hamburger_jax.serve import http
from hamburger_jax.serve import service as service_limits
from hamburger_jax.serve.protocol import Limits, Modes
from hamburger_jax.serve.service import Service
from hamburger_jax.serve.worker import EngineWorker
from hamburger_jax.text.tokenizer import TokenizerError

_log = logging.getLogger(__name__)


def _flag(default, help_text: str):
  return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass
class ServeArgs:
  """Everything the server accepts (field = flag)."""
  ckpt: str | None = _flag(
      None, "hamburger_jax export dir, HF Llama dir, original HAMburger checkpoint (with "
            "--base_config), or 'smollm2' (the shipped model)")
  base_config: str | None = _flag(None, "HF config.json of the base model (original checkpoints)")
  tokenizer: str | None = _flag(None, "tokenizer.json or its directory (default: beside --ckpt)")
  token_ids: bool = _flag(False, "no tokenizer: completions take and return token ids")
  system: str | None = _flag(None, "system message of chat requests that give none")
  base: bool = _flag(False, "plain base-model decoding (the speed baseline)")
  draft_vocab: str | None = _flag(
      None, "token ids drafts choose from: 'full' (the whole vocabulary) or a draft vocabulary "
            "file (default: the checkpoint's draft_vocab.json if it has one)")
  code_fences: bool = _flag(
      True, "fenced code (between tokens holding ```) decodes one token per macro step, as the "
            "base reads it (--no-code_fences: merge there too)")
  engine: str = _flag("continuous", "'continuous' (up to --num_slots requests decoded together) "
                                     "or 'serial' (one request at a time, the baseline)")
  num_slots: int = _flag(8, "requests decoded together (continuous engine)")
  cache_length: int = _flag(1024, "KV slots per request (bounds the prompt length)")
  chunk_steps: int = _flag(8, "macro steps between two event deliveries")
  micro_policy: str = _flag("all", "continuous engine's micro-step policy")
  compact_micro_steps: bool = _flag(
      False, "micro steps run on the rows that continue only (continuous engine; same answers)")
  min_prompt_bucket: int = _flag(16, "smallest prefill length bucket")
  host: str = _flag("127.0.0.1", "address to listen on (127.0.0.1: this machine only)")
  port: int = _flag(8000, "port to listen on")
  model_id: str | None = _flag(
      None, "the model name clients send (default: hamburger-<ckpt name>)")
  max_queue: int = _flag(64, "requests waiting for a slot before 503")
  request_timeout: float = _flag(600.0, "seconds before a request is cancelled and answered 408")
  max_tokens: int = _flag(0, "largest max_tokens accepted (0 = cache_length)")
  default_max_tokens: int = _flag(256, "max_tokens of requests that give none (at most the "
                                                 "limit)")
  temperature: float = _flag(1.0, "temperature of requests that give none (OpenAI's default)")
  confidence: float | None = _flag(None, "confidence of requests that give none (default: the "
                                         "checkpoint's recommended value, else 0.8; verified "
                                         "decoding: 0.001)")
  min_token_prob: float | None = _flag(None, "min_token_prob of requests that give none (default: "
                                             "the checkpoint's recommended value, else 0)")
  shutdown_timeout: float = _flag(30.0, "seconds running requests get after SIGTERM")
  warmup: bool = _flag(True, "compile before listening: the decode steps, and the prefill of "
                             "every prompt length up to --warmup_prompt_tokens")
  warmup_prompt_tokens: int = _flag(128, "prompts up to this many tokens (a chat turn with the "
                                         "system message) compile nothing when they arrive")
  log_level: str = _flag("info", "uvicorn log level")
  verify: bool = _flag(False, "verified decoding: the base checks the micro decoder's drafts, so "
                              "every answer is the base model's own (greedy: token for token)")
  verify_steps: int = _flag(0, "verified decoding's tokens per forward at most (drafts + 1), "
                               "2..16; 0: what the verification drafter was trained for")
  lookup_drafts: int = _flag(2, "verified decoding drafts what followed an earlier stretch of a "
                                "request's tokens where its last N or more repeat it (greedy "
                                "requests; 0: off)")
  width_rule: bool = _flag(False, "verified decoding sends only the drafts worth their "
                                  "forward's width, weighed by their calibrated probabilities "
                                  "(the checkpoint's verify_calibration.json), the widths' costs "
                                  "timed at start: faster at batch 1 on a CPU, not at batch 8")
  draft_branches: int = _flag(1, "verified decoding drafts this many chains and checks them as "
                                 "one tree per forward (greedy requests; more tokens per forward "
                                 "where wide forwards are cheap, e.g. accelerators)")
  verify_requests: bool = _flag(
      False, "run merged and verified decoding side by side, each request choosing with "
             "'verify': true|false (--verify: the default); one copy of the base weights, twice "
             "the KV buffers and the compile time")
  quantize: str = _flag("none", "weights decoding reads: 'none' (as stored), 'int8' (int8 with "
                                "per-channel scales), 'int8:G' (a scale per group of G inputs, "
                                "e.g. int8:64), 'int8:Gz' (and a zero point: int8:32z keeps "
                                "the shipped base's 4-bit weights exactly) or 'micro:<mode>' (the "
                                "drafter alone, e.g. micro:int8), quantized once at load")
  mesh: str = _flag("", "decode one model over a device mesh, e.g. 'tensor=4' or "
                        "'data=2,tensor=4' (their product = the devices; '' = one device)")
  kv_cache: str = _flag("model", "what the KV buffers store: 'model' (the model's dtype) or "
                                 "'int8' (a float32 scale per head vector; ~half the bytes)")
  cpu_dots: str = _flag(cpu_dots.DEFAULT, "on a CPU, how XLA compiles the decode programs' "
                                          "dots: 'plain' (YNNPACK's dot fusions off) or "
                                          "'ynnpack' (XLA's default)")
  compilation_cache: str | None = _flag(
      None, "directory where compiled decode programs are kept for later runs (default: "
            "$JAX_COMPILATION_CACHE_DIR, else ~/.cache/hamburger_jax/xla; '' = off)")
  max_body_bytes: int = _flag(app_limits.MAX_BODY_BYTES, "largest request body (413 above it)")
  chars_per_token: int = _flag(
      service_limits.CHARS_PER_TOKEN, "prompts longer than this many characters per KV slot are "
                                      "refused (context_length_exceeded) before tokenizing")
  max_tokenize_chars: int = _flag(service_limits.MAX_TOKENIZE_CHARS,
                                  "longest text /tokenize accepts")
  header_timeout: float = _flag(http.HEADER_TIMEOUT_S, "seconds a client has to send its headers")
  body_timeout: float = _flag(http.BODY_TIMEOUT_S, "seconds a client has to send its body")
  keep_alive_timeout: float = _flag(http.KEEP_ALIVE_S, "seconds an idle connection stays open")
  max_header_bytes: int = _flag(http.MAX_HEADER_BYTES, "largest request head")


def check_args(a: ServeArgs) -> None:
  """Fails fast, before any loading or compiling."""
  if not a.ckpt:
    raise UsageError("--ckpt is required (a hamburger_jax export dir, an HF Llama dir, an "
                     "original HAMburger checkpoint with --base_config, or 'smollm2').")
  if a.engine not in engines.ENGINES:
    raise UsageError(f"--engine must be one of {engines.ENGINES}, got {a.engine!r}.")
  positive = ("num_slots", "cache_length", "chunk_steps", "min_prompt_bucket", "max_queue",
              "default_max_tokens", "max_body_bytes", "chars_per_token", "max_tokenize_chars",
              "max_header_bytes", "warmup_prompt_tokens")
  for name in positive:
    if getattr(a, name) < 1:
      raise UsageError(f"--{name} must be >= 1, got {getattr(a, name)}.")
  if not 0 < a.port < 65536:
    raise UsageError(f"--port must be in 1..65535, got {a.port}.")
  if a.max_tokens < 0:
    raise UsageError(f"--max_tokens must be >= 0 (0 = --cache_length), got {a.max_tokens}.")
  for name in ("request_timeout", "shutdown_timeout", "header_timeout", "body_timeout",
               "keep_alive_timeout"):
    if not 0 < getattr(a, name) < float("inf"):
      raise UsageError(f"--{name} must be a number of seconds > 0, got {getattr(a, name)}.")
  if (a.verify or a.verify_requests) and a.base:
    flag = "--verify" if a.verify else "--verify_requests"
    raise UsageError(f"{flag} checks HAMburger's drafts with the base; --base has no drafts: "
                     "give one of them.")
  check_verify_steps(a.verify_steps, a.verify or a.verify_requests)
  check_draft_branches(a.draft_branches, a.verify or a.verify_requests)
  check_lookup_drafts(a.lookup_drafts, a.verify or a.verify_requests, a.draft_branches)
  if not 0 <= a.temperature <= 2 or not (a.confidence is None or 0 < a.confidence <= 1):
    raise UsageError("--temperature must be in [0, 2] and --confidence in (0, 1].")
  if a.min_token_prob is not None and not 0 <= a.min_token_prob <= 1:
    raise UsageError(f"--min_token_prob must be in [0, 1], got {a.min_token_prob}.")
  check_quantize(a.quantize)
  check_kv_cache(a.kv_cache)
  check_cpu_dots(a.cpu_dots)
  parse_mesh(a.mesh)


def check_port_free(host: str, port: int) -> None:
  """UsageError naming the port when nothing can listen on host:port."""
  with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind((host, port))
    except OSError as e:
      raise UsageError(f"Cannot listen on {host}:{port} ({e.strerror}): stop what uses the port "
                       "or pass another --port / --host.") from None


def default_model_id(ckpt: str) -> str:
  return "hamburger-" + os.path.basename(os.path.normpath(ckpt))


def service_for(engine, cfg, tokenizer, a: ServeArgs, fence_ids: tuple[int, ...] | None = None,
                recommended: dict | None = None) -> Service:
  """The Service around `engine` (of kind a.engine; a `ModeRouter` with a.verify_requests; its
  worker not started yet). fence_ids: code-fence ids (None: the tokenizer's when a.code_fences).
  recommended: the checkpoint's knobs for merged decoding (verified decoding has its own)."""
  merged = resolve_knobs(vars(a), recommended or {})
  verified = resolve_knobs(vars(a), verify.DEFAULT_KNOBS)
  base = a.base or not isinstance(cfg, HamburgerConfig)
  limit = a.max_tokens or a.cache_length
  limits = Limits(max_tokens=limit, default_max_tokens=min(a.default_max_tokens, limit),
                  default_temperature=a.temperature, default_confidence=merged["confidence"],
                  default_min_token_prob=merged["min_token_prob"],
                  verify_confidence=verified["confidence"],
                  verify_min_token_prob=verified["min_token_prob"],
                  modes=Modes(default=a.verify, both=a.verify_requests, base=base))
  llama = cfg.base if isinstance(cfg, HamburgerConfig) else cfg
  slots = (a.num_slots if a.engine == "continuous" else 1) * (2 if a.verify_requests else 1)
  return Service(EngineWorker(engine, capacity=slots + a.max_queue),
                 a.model_id or default_model_id(a.ckpt), tokenizer=tokenizer,
                 vocab_size=llama.vocab_size, max_prompt_len=engine.max_prompt_len,
                 limits=limits, request_timeout=a.request_timeout, system=a.system,
                 engine_name=a.engine, chars_per_token=a.chars_per_token,
                 max_tokenize_chars=a.max_tokenize_chars,
                 fence_ids=code_fence_ids(tokenizer, a.code_fences, base)
                 if fence_ids is None else fence_ids)


def warm_up_lengths(min_bucket: int, up_to: int, max_prompt_len: int) -> list[int]:
  """Prompt lengths, one per prefill bucket (powers of two from `min_bucket`) that holds a
  prompt of up to `up_to` tokens, each leaving room for 2 new tokens in the KV buffer."""
  lengths, bucket = [], min_bucket
  while True:
    n = min(bucket + 1, max_prompt_len - 2)          # a prompt's prefill is all but its last token
    if n < 1 or (lengths and n <= lengths[-1]):
      return lengths
    lengths.append(n)
    if bucket >= up_to:
      return lengths
    bucket *= 2


def warm_up(engine, a: ServeArgs, what: str = "decoding") -> None:
  """Compiles the engine's steps and every prefill bucket of prompts up to
  a.warmup_prompt_tokens, one request each, before the worker thread exists."""
  start = time.perf_counter()
  lengths = warm_up_lengths(a.min_prompt_bucket, a.warmup_prompt_tokens, engine.max_prompt_len)
  if not lengths:                                    # a KV buffer too short for any prompt
    return
  _log.info("Compiling %s: its steps and the prefill of prompts up to %d tokens (--warmup_"
            "prompt_tokens)...", what, lengths[-1])
  for n in lengths:
    engine.submit(engines.Request(prompt_ids=[0] * n, max_new_tokens=2))
    while engine.has_work():
      engine.step()
  _log.info("Compiled %s in %.1f s.", what, time.perf_counter() - start)


def mode_router(a: ServeArgs, d, make) -> engines.ModeRouter:
  """Merged and verified engines (`make(params, verify=...)`, each warmed when a.warmup) over one
  copy of the base weights: the verified engine's params are the merged engine's placed ones
  with params["micro_decoder"] from the checkpoint's verification drafter (if it has one).
  d: the `open_checkpoint` result, loaded without quantizing and without that drafter."""
  if d.base_only:
    raise UsageError("--verify_requests needs a HAMburger checkpoint: this one decodes with its "
                     "base model alone (no drafts to verify).")
  micro = load_verify_drafter(checkpoint_dir(a.ckpt), d.params)["micro_decoder"]
  merged = make(apply_quantize(d.params, d.config, a.quantize), verify=False)
  micro = apply_quantize({"micro_decoder": micro}, None, a.quantize)["micro_decoder"]
  verified = make({**merged.params, "micro_decoder": micro}, verify=True,
                  verify_steps=a.verify_steps or verify_drafter_steps(checkpoint_dir(a.ckpt)),
                  draft_branches=a.draft_branches,
                  lookup_drafts=lookup_setting(a.lookup_drafts, True, a.draft_branches),
                  draft_width_rule=width_rule(a.width_rule, verify_calibration(
                      checkpoint_dir(a.ckpt)), a.draft_branches),
                  draft_width_costs="measure" if a.width_rule else None)
  if a.warmup:
    warm_up(merged, a, "merged decoding")
    warm_up(verified, a, "verified decoding")
  return engines.ModeRouter(merged, verified, default=a.verify)


def build(a: ServeArgs) -> Service:
  """Loads the checkpoint and tokenizer (`open_checkpoint`) and builds the engine(s) and Service."""
  check_args(a)
  persistent_cache.enable(a.compilation_cache, _log.warning)
  both = a.verify_requests
  start = time.perf_counter()
  d = open_checkpoint(a.ckpt, base_config=a.base_config, tokenizer=a.tokenizer, base=a.base,
                      token_ids=a.token_ids, draft_vocab=a.draft_vocab,
                      code_fences=a.code_fences, system=a.system,
                      quantize=None if both else a.quantize, verify=a.verify and not both)
  _log.info("Loaded %s in %.1f s.", a.ckpt, time.perf_counter() - start)
  make = functools.partial(
      engines.make_engine, a.engine, d.config, base=d.base_only, num_slots=a.num_slots,
      cache_length=a.cache_length, chunk_steps=a.chunk_steps,
      eos_ids=tuple(d.llama.eos_token_ids), micro_policy=a.micro_policy,
      min_prompt_bucket=a.min_prompt_bucket, compact_micro_steps=a.compact_micro_steps,
      draft_vocab=d.draft_vocab, mesh=make_decode_mesh(a.mesh) if a.mesh else None,
      kv_cache=a.kv_cache, cpu_dots=a.cpu_dots)
  if both:
    engine = mode_router(a, d, make)
  else:
    engine = make(d.params, verify=a.verify,
                  verify_steps=(a.verify_steps or d.verify_steps) if a.verify else None,
                  draft_branches=a.draft_branches if a.verify else 1,
                  lookup_drafts=lookup_setting(a.lookup_drafts, a.verify, a.draft_branches),
                  draft_width_rule=width_rule(a.width_rule, d.draft_width_rule, a.draft_branches),
                  draft_width_costs="measure" if a.width_rule else None)
    if a.warmup:
      warm_up(engine, a, "verified decoding" if a.verify else "decoding")
  return service_for(engine, d.config, d.tokenizer, dataclasses.replace(a, system=d.system),
                     d.fence_ids, d.knob_defaults)


def serve(service: Service, a: ServeArgs) -> None:
  """Runs uvicorn until SIGTERM / SIGINT; drains as described in the module docstring."""
  import uvicorn  # pylint: disable=g-import-not-at-top
  from hamburger_jax.serve.app import create_app  # pylint: disable=g-import-not-at-top

  class _Server(uvicorn.Server):
    def handle_exit(self, sig, frame):
      if not service.draining:
        service.start_draining(max(a.shutdown_timeout - 1.0, a.shutdown_timeout / 2))
      super().handle_exit(sig, frame)

  config = uvicorn.Config(create_app(service, max_body_bytes=a.max_body_bytes), host=a.host,
                          port=a.port, log_level=a.log_level,
                          timeout_graceful_shutdown=a.shutdown_timeout,
                          **http.uvicorn_options(a.header_timeout, a.body_timeout,
                                                 a.keep_alive_timeout, a.max_header_bytes))
  # uvicorn re-raises the stop signal after its graceful shutdown: by then the work is done.
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  _Server(config).run()


# --- command line ---------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
  def error(self, message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv: Sequence[str]) -> ServeArgs:
  parser = _Parser(prog="serve.py", description="Serve a HAMburger checkpoint over an OpenAI-"
                   "compatible HTTP API.")
  for f in dataclasses.fields(ServeArgs):
    default = f.default
    if isinstance(default, bool) or str(f.type).startswith("bool"):
      parser.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, default=default,
                          help=f.metadata["help"])
    else:
      kind = {"int": int, "float": float}.get(str(f.type).split(" |")[0], str)
      parser.add_argument(f"--{f.name}", type=kind, default=default, help=f.metadata["help"])
  return ServeArgs(**vars(parser.parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> int:
  """Parses, builds and serves; returns the exit code (2 with one line for unusable input)."""
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
  try:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    check_args(a)
    check_port_free(a.host, a.port)          # before minutes of loading and compiling
    service = build(a)
  except (UsageError, DecodeInputError, CheckpointError, TokenizerError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  serve(service, a)
  return 0
