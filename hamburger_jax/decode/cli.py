"""The library side of `decode.py`: load a checkpoint, read prompts, decode, print text or JSON.

Flags -> DecodeArgs -> `open_checkpoint` -> Sampler -> printed text or JSON. Importable from a
notebook:
    from hamburger_jax.decode.cli import DecodeArgs, run
    run(DecodeArgs(ckpt="/tmp/tiny_ckpt", prompt="1,5,7", token_ids=True, json=True))

`run` returns the exit code: 0, or 2 after one clear line on stderr for unusable input (empty
prompt, prompt longer than the KV buffer, confidence outside (0, 1], max_new_tokens < 1, unknown
token ids, missing tokenizer or checkpoint, prompt text over --max_prompt_bytes or
--max_prompts, flags that contradict each other or would be ignored). Several prompts decode in
chunks of --batch_size rows, each chunk printed as it finishes.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Sequence, TextIO

from hamburger_jax.convert import CheckpointError
from hamburger_jax.decode import persistent_cache
from hamburger_jax.decode import prompts as prompts_lib
from hamburger_jax.decode import verify
from hamburger_jax.decode.checkpoint import (Decodable, check_checkpoint, check_cpu_dots,
                                             check_draft_branches, check_kv_cache,
                                             check_lookup_drafts, check_quantize,
                                             check_verify_steps, lookup_setting,
                                             open_checkpoint, resolve_knobs, width_rule)
from hamburger_jax.decode.chunks import decode_chunks
from hamburger_jax.decode.evaluation import base_comparison
from hamburger_jax.decode.memory import check_buffer_memory, device_memory
from hamburger_jax.decode.mesh import make_decode_mesh
from hamburger_jax.decode.prompts import UsageError, parse_token_ids
from hamburger_jax.decode.render import Printer, print_comparison, print_json, stream_one, summary
from hamburger_jax.decode.sampler import DecodeInputError, Sampler
from hamburger_jax.model import cpu_dots as cpu_dots_lib
from hamburger_jax.shipped import named
from hamburger_jax.testing.fixtures import make_tiny_checkpoint
from hamburger_jax.text.tokenizer import TokenizerError


MAX_NEW_TOKENS = 1 << 20        # also the largest --cache_length
MAX_BATCH_SIZE = 4096           # the largest --batch_size
# Flags that only steer HAMburger's groups (value when not given): refused with --base.
GROUP_FLAGS = {"confidence": None, "min_token_prob": None, "max_group": 0, "draft_vocab": None}


# --- arguments -----------------------------------------------------------------------------------

@dataclasses.dataclass
class DecodeArgs:
  """Everything decode.py accepts (field = flag)."""
  ckpt: str | None = None           # export dir, HF Llama dir, original checkpoint, or "smollm2"
  base_config: str | None = None    # HF config.json of the base model (original checkpoints)
  tokenizer: str | None = None      # tokenizer.json or its directory (default: beside --ckpt)
  prompt: str | None = None         # one prompt (comma-separated ids with --token_ids)
  prompt_file: str | None = None    # one prompt per line, decoded in chunks of batch_size
  batch_size: int = 32              # prompts per decode call (rows of one chunk)
  max_prompt_bytes: int = prompts_lib.MAX_PROMPT_BYTES  # cap on --prompt_file / stdin / --prompt
  max_prompts: int = prompts_lib.MAX_PROMPTS            # cap on prompt lines
  token_ids: bool = False           # prompts are comma-separated token ids; output ids
  chat: bool = False                # wrap prompts in the tokenizer's chat template
  system: str | None = None         # system message for --chat
  max_new_tokens: int = 256
  confidence: float | None = None   # None: the checkpoint's recommended value (else 0.8)
  min_token_prob: float | None = None  # a drafted token is kept only if its prob >= it
  temperature: float = 0.0          # 0 = greedy
  top_k: int = 0                    # 0 = off
  top_p: float = 1.0                # 1 = off
  max_group: int = 0                # cap on tokens per macro step (0 = the model's S)
  seed: int = 0
  base: bool = False                # plain base-model decoding (the speed baseline)
  draft_vocab: str | None = None    # "full", a draft vocabulary file; None: the checkpoint's
  code_fences: bool = True          # fenced code (between ``` tokens) decodes one token per step
  show_groups: bool = False         # delimit each macro step's group (colored on a tty)
  json: bool = False                # print outputs and stats as JSON
  cache_length: int = 0             # KV slots per row (0 = longest prompt + max_new_tokens)
  stream_steps: int = 4             # macro steps per streamed chunk
  make_tiny_checkpoint: str | None = None  # write a random tiny checkpoint here and exit
  compare_base: bool = False        # also decode with the base alone; print both and the ratios
  verify: bool = False              # verified decoding: the base checks the drafts (its answer)
  verify_steps: int = 0             # --verify: tokens per forward at most (0: the drafter's)
  draft_branches: int = 1           # --verify: chains of drafts checked as one tree
  lookup_drafts: int = 2            # --verify: draft repeats of >= this many tokens (0: off)
  width_rule: bool = False          # --verify: send only the drafts worth their forward's width
  quantize: str = "none"            # "int8": per-channel scales; "int8:G": per group of G inputs
  mesh: str = ""                    # "data=2,tensor=4": one model over a device mesh ("" = one)
  kv_cache: str = "model"           # what the KV buffers store: the model's dtype or "int8"
  cpu_dots: str = cpu_dots_lib.DEFAULT  # on a CPU: "plain" (YNNPACK dots off) or "ynnpack"
  compilation_cache: str | None = None  # compiled programs kept here ("" = off; None: default)


def check_args(a: DecodeArgs) -> None:
  """Fails fast, before any loading or compiling."""
  if a.make_tiny_checkpoint:
    return
  if not a.ckpt:
    raise UsageError("--ckpt is required (a hamburger_jax export dir, an HF Llama dir, or an "
                     "original HAMburger checkpoint with --base_config).")
  if a.confidence is not None and not (isinstance(a.confidence, (int, float))
                                       and 0.0 < a.confidence <= 1.0):
    raise UsageError(f"--confidence must be in (0, 1], got {a.confidence}.")
  if not 1 <= a.max_new_tokens <= MAX_NEW_TOKENS:
    raise UsageError(f"--max_new_tokens must be in 1..{MAX_NEW_TOKENS}, got {a.max_new_tokens}.")
  if a.cache_length < 0 or a.cache_length > MAX_NEW_TOKENS:
    raise UsageError(f"--cache_length must be in 0..{MAX_NEW_TOKENS}, got {a.cache_length}.")
  prompts_lib.check_seed(a.seed)
  prompts_lib.check_temperature(a.temperature)
  if a.prompt is not None and a.prompt_file is not None:
    raise UsageError("Give --prompt or --prompt_file, not both.")
  if a.stream_steps < 1:
    raise UsageError(f"--stream_steps must be >= 1, got {a.stream_steps}.")
  _check_range("batch_size", a.batch_size, MAX_BATCH_SIZE)
  _check_range("max_prompt_bytes", a.max_prompt_bytes, 1 << 30)
  _check_range("max_prompts", a.max_prompts, 1 << 20)
  if a.system is not None:
    prompts_lib.utf8_text(a.system, "--system")
  check_quantize(a.quantize)
  check_kv_cache(a.kv_cache)
  check_cpu_dots(a.cpu_dots)
  check_flag_pairs(a)


def _check_range(name: str, value: int, limit: int) -> None:
  if not 1 <= value <= limit:
    raise UsageError(f"--{name} must be in 1..{limit}, got {value}.")


def check_flag_pairs(a: DecodeArgs) -> None:
  """UsageError naming both flags and the fix when two flags contradict each other or one
  would be ignored."""
  if a.verify and a.base:
    raise UsageError("--verify checks HAMburger's drafts with the base; --base has no drafts: "
                     "give one of them.")
  check_verify_steps(a.verify_steps, a.verify)
  check_draft_branches(a.draft_branches, a.verify)
  check_lookup_drafts(a.lookup_drafts, a.verify, a.draft_branches)
  if a.compare_base and a.base:
    raise UsageError("--compare_base decodes with the base alone beside HAMburger; with --base "
                     "both runs would be the base: drop --base or --compare_base.")
  if a.base:
    given = [name for name, unset in GROUP_FLAGS.items() if getattr(a, name) != unset]
    if given:
      raise UsageError(f"--{given[0]} steers HAMburger's groups; --base decodes one token per "
                       f"step and would ignore it: drop --{given[0]} or --base.")
  if a.token_ids and a.chat:
    raise UsageError("--chat wraps text in the chat template; --token_ids prompts are ids it "
                     "cannot wrap: drop --chat, or give text prompts without --token_ids.")
  if a.system is not None and a.token_ids:
    raise UsageError("--system is text for the chat template; --token_ids prompts are ids with "
                     "no template: drop --system, or give text prompts without --token_ids.")
  if a.system is not None and not a.chat and named(a.ckpt) is None:
    raise UsageError("--system is the system message of chat prompts; without --chat the "
                     f"prompts of {a.ckpt} are plain text: add --chat or drop --system.")


def read_prompt_lines(a: DecodeArgs, stdin: TextIO) -> list[str]:
  """The prompt lines of --prompt, --prompt_file or stdin; UsageError if empty, not UTF-8, over
  --max_prompt_bytes (nothing past the cap is read) or over --max_prompts lines."""
  caps = (a.max_prompt_bytes, a.max_prompts)
  if a.prompt is not None:
    lines = [prompts_lib.utf8_text(a.prompt, "The prompt")]
    prompts_lib.check_bytes(lines[0], "The prompt", a.max_prompt_bytes)
  elif a.prompt_file is not None:
    try:
      with open(a.prompt_file, "rb") as f:
        lines = prompts_lib.read_lines(f, f"--prompt_file {a.prompt_file}", *caps)
    except OSError as e:
      raise UsageError(f"Cannot read --prompt_file {a.prompt_file}: {e.strerror}.") from e
  elif stdin is not None:
    lines = prompts_lib.read_lines(getattr(stdin, "buffer", stdin), "The text on stdin", *caps)
  else:
    lines = []                                   # the process has no stdin
  if not lines or all(not line.strip() for line in lines):
    raise UsageError("The prompt is empty: pass --prompt, --prompt_file, or text on stdin.")
  return lines


# --- the command ---------------------------------------------------------------------------------

def run(a: DecodeArgs, stdout: TextIO | None = None, stderr: TextIO | None = None,
        stdin: TextIO | None = None) -> int:
  """Runs decode.py's job; returns the exit code (2 with one message line for bad input)."""
  stdout, stderr, stdin = stdout or sys.stdout, stderr or sys.stderr, stdin or sys.stdin
  try:
    return _run(a, stdout, stderr, stdin)
  except (UsageError, DecodeInputError, CheckpointError, TokenizerError) as e:
    print(f"error: {e}", file=stderr)
    return 2


def _open(a: DecodeArgs) -> Decodable:
  """open_checkpoint with decode.py's flags (--chat off = the checkpoint's own choice)."""
  return open_checkpoint(a.ckpt, base_config=a.base_config, tokenizer=a.tokenizer, base=a.base,
                         token_ids=a.token_ids, draft_vocab=a.draft_vocab,
                         code_fences=a.code_fences, chat=a.chat or None, system=a.system,
                         quantize=a.quantize, verify=a.verify)


def encode(lines: Sequence[str], tokenizer, chat: bool = False,
           system: str | None = None) -> list[list[int]]:
  """Prompt lines -> token ids (comma-separated ids when tokenizer is None)."""
  if tokenizer is None:
    return [parse_token_ids(line, i) for i, line in enumerate(lines)]
  return [tokenizer.encode(line, chat=chat, system=system) for line in lines]


def check_plain_checkpoint(a: DecodeArgs, d: Decodable) -> None:
  """UsageError for HAMburger-only flags on a plain Llama checkpoint (it decodes as the base)."""
  if not d.base_only or a.base:
    return
  given = [name for name in ("compare_base", "verify") if getattr(a, name)]
  given += [name for name, unset in GROUP_FLAGS.items() if getattr(a, name) != unset]
  if given:
    raise UsageError(f"--{given[0]} needs a HAMburger checkpoint; {a.ckpt} is a plain Llama "
                     f"checkpoint, decoded one token per step: drop --{given[0]}.")


def _samplers(a: DecodeArgs, d: Decodable, prompts):
  """-> (sampler, base sampler for --compare_base or None, knobs). The KV buffers are sized for
  the longest prompt and checked against the device's memory for one chunk of --batch_size."""
  check_plain_checkpoint(a, d)
  longest = max(len(p) for p in prompts)
  cache_length = a.cache_length or -(-(longest + a.max_new_tokens) // 64) * 64
  out_length = -(-a.max_new_tokens // 64) * 64
  mesh = make_decode_mesh(a.mesh) if a.mesh else None
  check_buffer_memory(d.llama, min(len(prompts), a.batch_size), cache_length,
                      mesh and (device_memory() or 0) * mesh.devices.size, a.kv_cache)
  sampler = Sampler(d.config, d.params, base=d.base_only, cache_length=cache_length,
                    out_length=out_length, eos_ids=d.eos_ids, draft_vocab=d.draft_vocab,
                    verify=a.verify, mesh=mesh, kv_cache=a.kv_cache,
                    verify_steps=(a.verify_steps or d.verify_steps) if a.verify else None,
                    draft_branches=a.draft_branches,
                    lookup_drafts=lookup_setting(a.lookup_drafts, a.verify, a.draft_branches),
                    draft_width_rule=width_rule(a.width_rule, d.draft_width_rule, a.draft_branches),
                    draft_width_costs="measure" if a.width_rule else None,
                    cpu_dots=a.cpu_dots)
  sampler.check_prompts(prompts)
  knobs = dict(max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_k=a.top_k,
               top_p=a.top_p, seed=a.seed,
               max_group=(a.max_group or None) if not d.base_only else None,
               fence_ids=d.fence_ids, **resolve_knobs(
                   vars(a), verify.DEFAULT_KNOBS if a.verify else d.knob_defaults))
  base = None
  if a.compare_base:
    base = Sampler(d.config, d.params, base=True, cache_length=cache_length,
                   out_length=out_length, eos_ids=d.eos_ids, mesh=mesh, kv_cache=a.kv_cache,
                   cpu_dots=a.cpu_dots)
  return sampler, base, knobs


def _decode(a: DecodeArgs, sampler, base_sampler, knobs, prompts, printer, stdout):
  """-> (result, base result or None). One prompt streams, unless the run is timed (--json,
  --compare_base); several decode in chunks of --batch_size, each printed when it is done."""
  if len(prompts) == 1 and not a.json and base_sampler is None:
    return stream_one(sampler, prompts[0], printer, knobs, a.stream_steps, stdout), None

  def show(start, result, _):
    if a.json:
      return
    for i in range(len(result.tokens)):
      print(f"### {start + i}", file=stdout)
      print(printer.full(result.tokens[i], result.groups(i), result.logprobs[i]), file=stdout)
    stdout.flush()

  return decode_chunks(sampler, prompts, knobs, a.batch_size, base_sampler, show)


def _run(a: DecodeArgs, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> int:
  check_args(a)
  persistent_cache.enable(a.compilation_cache, lambda m: print(f"warning: {m}", file=stderr))
  if a.make_tiny_checkpoint:
    make_tiny_checkpoint(a.make_tiny_checkpoint, a.seed)
    print(a.make_tiny_checkpoint, file=stdout)
    return 0
  check_checkpoint(a.ckpt)
  lines = read_prompt_lines(a, stdin)
  prompts = encode(lines, None) if a.token_ids else None    # ids are checked before loading
  d = _open(a)
  prompts = prompts or encode(lines, d.tokenizer, d.chat, d.system)
  sampler, base_sampler, knobs = _samplers(a, d, prompts)
  printer = Printer(d.tokenizer, a.show_groups, a.show_groups and not a.json and stdout.isatty())
  result, base_result = _decode(a, sampler, base_sampler, knobs, prompts, printer, stdout)
  stats = dict(result.stats(), mode="base" if d.base_only else "verify" if a.verify else "hamburger")
  if base_result is not None:
    stats["base"] = base_comparison(result, base_result)
  if a.json:
    print_json(prompts, result, stats, d.tokenizer, stdout)
    return 0
  print(summary(stats), file=stderr)
  if base_result is not None:
    print_comparison(stats["base"], base_result, d.tokenizer, len(prompts) == 1, stdout, stderr)
  return 0


# --- absl flags (used by decode.py) -------------------------------------------------------------

_HELP = {
    "ckpt": "hamburger_jax export dir, HF Llama dir (plain decoding), original HAMburger "
            "checkpoint file (with --base_config), or 'smollm2' (the shipped model)",
    "base_config": "HF config.json of the base model, for an original HAMburger checkpoint",
    "tokenizer": "tokenizer.json or its directory (default: beside --ckpt)",
    "prompt": "one prompt (comma-separated ids with --token_ids); also accepted as a positional "
              "argument; default: stdin, one prompt per line",
    "prompt_file": "file with one prompt per line (decoded in chunks of --batch_size)",
    "batch_size": "prompts decoded together (one chunk); more prompts decode chunk after chunk, "
                  "each printed when done",
    "max_prompt_bytes": "refuse prompt text (--prompt_file, stdin, --prompt) larger than this; "
                        "nothing past it is read",
    "max_prompts": "refuse more prompt lines than this",
    "token_ids": "prompts are comma-separated token ids and output is ids (no tokenizer)",
    "chat": "wrap prompts in the chat template (Llama-3 headers or ChatML)",
    "system": "system message for --chat (a named checkpoint such as smollm2 is a chat model: "
              "--chat is implied)",
    "max_new_tokens": "exact maximum of generated tokens per prompt",
    "confidence": "in (0, 1]: a group goes on while 1 - sigmoid(stop logit) >= confidence "
                  "(default: the checkpoint's recommended value, else 0.8)",
    "min_token_prob": "in [0, 1]: a drafted token joins its group only if the micro decoder's "
                      "probability of it is >= this, else the group ends before it (0 = off, "
                      "1 = one token per step; "
                      "default: the checkpoint's recommended value, else 0)",
    "temperature": "sampling temperature (0 = greedy)",
    "top_k": "keep the k most likely tokens (0 = off)",
    "top_p": "nucleus sampling mass (1 = off)",
    "max_group": "cap on tokens per macro step (0 = the model's max_steps; 1 = base-equivalent)",
    "seed": "sampling seed",
    "base": "plain base-model decoding, one token per step (the speed baseline)",
    "draft_vocab": "token ids drafts choose from: 'full' (the whole vocabulary) or a draft "
                   "vocabulary file (default: the checkpoint's draft_vocab.json if it has one)",
    "code_fences": "fenced code (between tokens holding ```) decodes one token per macro step, "
                   "as the base reads it (--nocode_fences: merge there too)",
    "show_groups": "mark each macro step's group; colored by token probability on a terminal",
    "json": "print outputs and stats as JSON",
    "cache_length": "KV slots per row (0 = longest prompt + max_new_tokens, rounded up to 64)",
    "stream_steps": "macro steps per streamed chunk",
    "make_tiny_checkpoint": "write a random tiny HAMburger checkpoint to this directory and exit",
    "compare_base": "also decode with the base model alone in the same run; print its text and "
                    "the speed / KV-entry ratios",
    "verify": "verified decoding: the base checks the micro decoder's drafts in its next forward, "
              "so the answer is the base's own (greedy: token for token) in fewer forwards; "
              "--show_groups marks the tokens of each forward",
    "verify_steps": "--verify: the tokens a forward commits at most (drafts + 1), 2..16 (0: what "
                    "the checkpoint's verification drafter was trained for, else the model's "
                    "max_steps)",
    "draft_branches": "--verify: draft this many chains after each forward, the c-th from the "
                      "c-th most probable first draft, and check them all in the next forward "
                      "as one tree (greedy rows; 1 + c x (steps - 1) inputs a row): more tokens "
                      "per forward where a wider forward costs little (accelerators)",
    "lookup_drafts": "--verify: where a row's last N or more tokens repeat an earlier stretch "
                     "of its prompt or answer, draft what followed it there instead of the "
                     "micro decoder's drafts (0: off)",
    "width_rule": "--verify: a forward sends only the drafts worth its width's cost, weighed by "
                  "each draft's calibrated probability (the checkpoint's "
                  "verify_calibration.json; without one every draft is sent), the costs timed "
                  "at start on this machine (a few seconds): faster at batch 1 on a CPU, not at "
                  "batch 8 (docs/results/quality.md)",
    "quantize": "weights the decode loop reads: 'none' (as stored), 'int8' (int8 with "
                "per-output-channel scales, quantized once at load: half the weight bytes of "
                "bfloat16 per step), 'int8:G' (a scale per group of G inputs, e.g. int8:64; G "
                "must divide every quantized weight's input width), 'int8:Gz' (a zero point "
                "per group too: int8:32z keeps the shipped base's 4-bit weights exactly) or "
                "'micro:<mode>' (the drafter alone, e.g. micro:int8: with --verify the answers "
                "stay the base's)",
    "mesh": "decode one model over a device mesh, e.g. 'tensor=4' or 'data=2,tensor=4' (axes "
            "data, fsdp, tensor; their product = the devices): heads, kv heads, MLP and "
            "vocabulary split over tensor, rows over data ('' = one device)",
    "kv_cache": "what the KV buffers store: 'model' (the model's dtype) or 'int8' (int8 with a "
                "float32 scale per head vector: about half the KV bytes of bfloat16)",
    "cpu_dots": "on a CPU, how XLA compiles the decode programs' dots: 'plain' (YNNPACK's dot "
                "fusions off: a verified forward of a few tokens per row then costs far less "
                "than with YNNPACK; docs/results/step_costs.md) or 'ynnpack' (XLA's default)",
    "compilation_cache": "directory where compiled decode programs are kept for later runs "
                         "(default: $JAX_COMPILATION_CACHE_DIR, else ~/.cache/hamburger_jax/xla; "
                         "'' = off)",
}


def define_flags(flags_module) -> None:
  """Defines one absl flag per DecodeArgs field."""
  defaults = DecodeArgs()
  for field in dataclasses.fields(DecodeArgs):
    value = getattr(defaults, field.name)
    kind = field.type if isinstance(field.type, str) else field.type.__name__
    help_text = _HELP[field.name]
    if kind.startswith("bool"):
      flags_module.DEFINE_bool(field.name, value, help_text)
    elif kind.startswith("int"):
      flags_module.DEFINE_integer(field.name, value, help_text)
    elif kind.startswith("float"):
      flags_module.DEFINE_float(field.name, value, help_text)
    else:
      flags_module.DEFINE_string(field.name, value, help_text)


def args_from_flags(flag_values, positional: Sequence[str] = ()) -> DecodeArgs:
  """DecodeArgs from parsed flags; positional arguments are the prompt
  (`decode.py --ckpt DIR --token_ids 1,5,7` is `--token_ids --prompt 1,5,7`)."""
  names = [f.name for f in dataclasses.fields(DecodeArgs)]
  args = DecodeArgs(**{name: getattr(flag_values, name) for name in names})
  if positional:
    if args.prompt is not None:
      raise UsageError(f"Give the prompt once: --prompt or the argument {positional[0]!r}.")
    args.prompt = " ".join(positional)
  return args
