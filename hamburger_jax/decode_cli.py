"""The library side of `decode.py`: load a checkpoint, read prompts, decode, print text or JSON.

Importable from a notebook:
    from hamburger_jax.decode_cli import DecodeArgs, run
    run(DecodeArgs(ckpt="/tmp/tiny_ckpt", prompt="1,5,7", token_ids=True, json=True))

`run` returns the exit code: 0, or 2 after one clear line on stderr for unusable input (empty
prompt, prompt longer than the KV buffer, confidence outside (0, 1], max_new_tokens < 1, unknown
token ids, missing tokenizer or checkpoint). Also here: random weights that decode non-trivially
and `make_tiny_checkpoint`, used by tests, the README and the speed benchmark.
"""

from __future__ import annotations

import dataclasses
import functools
import json as jsonlib
import math
import os
import sys
from typing import Callable, Sequence, TextIO

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.batch import make_batch
from hamburger_jax.config import HamburgerConfig, get_preset
from hamburger_jax.convert import CheckpointError, load_model, save_hamburger
from hamburger_jax.decode_state import DecodeResult
from hamburger_jax.model import HamburgerModel, init_params
from hamburger_jax.sampler import DecodeInputError, Sampler
from hamburger_jax.tokenizer import TextStream, Tokenizer, TokenizerError


class UsageError(ValueError):
  """A bad command line (the message says what to change)."""


# --- random weights ------------------------------------------------------------------------------

def random_params(cfg: HamburgerConfig, seed: int = 0, weight_std: float = 0.08,
                  stop_mean: float = -1.0, stop_std: float = 2.0):
  """Random HAMburger params that decode non-trivially (they say nothing about quality).

  Every matrix is drawn with std `weight_std` (the default init's 0.02 gives near-uniform
  logits), then the stop head's last layer is rescaled so that its logits on random token
  groups have about mean `stop_mean` and std `stop_std`: continue-probabilities spread over
  (0, 1) and groups get lengths of 1..S that depend on the confidence, as with a trained model.
  """
  params = _jitted_init(cfg)(jax.random.PRNGKey(seed))
  params = jax.tree_util.tree_map(lambda x: x * (weight_std / 0.02) if x.ndim >= 2 else x, params)
  return calibrate_stop_head(cfg, params, stop_mean, stop_std, seed)


@functools.lru_cache(maxsize=8)
def _jitted_init(cfg: HamburgerConfig):
  return jax.jit(functools.partial(init_params, cfg))


@functools.lru_cache(maxsize=8)
def _jitted_forward(cfg: HamburgerConfig):
  return jax.jit(HamburgerModel(cfg).apply)


def calibrate_stop_head(cfg: HamburgerConfig, params, mean: float, std: float, seed: int = 0):
  """Rescales stop_head.dense_2 so stop logits on random teacher-forced groups ~ (mean, std)."""
  rng = np.random.default_rng(seed)
  s, vocab = cfg.max_steps, cfg.base.vocab_size
  examples = []
  for _ in range(4):
    steps = rng.integers(1, s + 1, 8).tolist()
    prompt = rng.integers(0, vocab, 8).tolist()
    examples.append((prompt, rng.integers(0, vocab, sum(steps)).tolist(), steps))
  batch = make_batch(examples, s, 8 + 8, pack=False)
  out = _jitted_forward(cfg)({"params": params}, batch)
  logits = np.asarray(out.stop_logits)[np.arange(s) < batch["target_lengths"][..., None]]
  return rescale_stop_head(params, logits, mean, std)


def rescale_stop_head(params, sample, mean: float, std: float):
  """Scales stop_head.dense_2's kernel and sets its bias so that stop logits which were `sample`
  (any array of them) would have this mean and std."""
  sample = np.asarray(sample, np.float64)
  head = params["micro_decoder"]["stop_head"]["dense_2"]
  scale = std / max(float(sample.std()), 1e-6)
  bias = mean - scale * (float(sample.mean()) - float(head["bias"][0]))
  new_head = {"kernel": head["kernel"] * scale, "bias": jnp.full_like(head["bias"], bias)}
  micro = dict(params["micro_decoder"], stop_head=dict(params["micro_decoder"]["stop_head"],
                                                       dense_2=new_head))
  return dict(params, micro_decoder=micro)


def tiny_config(num_layers: int = 4) -> HamburgerConfig:
  """The tiny preset with fewer layers (fast to compile): CPU tests and the README example."""
  if num_layers < 2:
    raise ValueError(f"tiny_config needs >= 2 layers (feature taps), got {num_layers}.")
  cfg = get_preset("tiny")
  base = dataclasses.replace(cfg.base, num_layers=num_layers)
  return cfg.replace(base=base, feature_layers=tuple(range(min(3, num_layers - 1))))


def make_tiny_checkpoint(directory: str, seed: int = 0, num_layers: int = 4) -> str:
  """Writes random tiny HAMburger weights as this project's export; returns the directory."""
  cfg = tiny_config(num_layers)
  save_hamburger(directory, cfg, random_params(cfg, seed))
  return directory


# --- arguments -----------------------------------------------------------------------------------

@dataclasses.dataclass
class DecodeArgs:
  """Everything decode.py accepts (field = flag)."""
  ckpt: str | None = None           # export dir, HF Llama dir, original checkpoint, or "smollm2"
  base_config: str | None = None    # HF config.json of the base model (original checkpoints)
  tokenizer: str | None = None      # tokenizer.json or its directory (default: beside --ckpt)
  prompt: str | None = None         # one prompt (comma-separated ids with --token_ids)
  prompt_file: str | None = None    # one prompt per line -> a batch
  token_ids: bool = False           # prompts are comma-separated token ids; output ids
  chat: bool = False                # wrap prompts in the tokenizer's chat template
  system: str | None = None         # system message for --chat
  max_new_tokens: int = 256
  confidence: float = 0.8
  temperature: float = 0.0          # 0 = greedy
  top_k: int = 0                    # 0 = off
  top_p: float = 1.0                # 1 = off
  max_group: int = 0                # cap on tokens per macro step (0 = the model's S)
  seed: int = 0
  base: bool = False                # plain base-model decoding (the speed baseline)
  show_groups: bool = False         # delimit each macro step's group (colored on a tty)
  json: bool = False                # print outputs and stats as JSON
  cache_length: int = 0             # KV slots per row (0 = longest prompt + max_new_tokens)
  stream_steps: int = 4             # macro steps per streamed chunk
  make_tiny_checkpoint: str | None = None  # write a random tiny checkpoint here and exit
  compare_base: bool = False        # also decode with the base alone; print both and the ratios


def check_args(a: DecodeArgs) -> None:
  """Fails fast, before any loading or compiling."""
  if a.make_tiny_checkpoint:
    return
  if not a.ckpt:
    raise UsageError("--ckpt is required (a hamburger_jax export dir, an HF Llama dir, or an "
                     "original HAMburger checkpoint with --base_config).")
  if not (isinstance(a.confidence, (int, float)) and 0.0 < a.confidence <= 1.0):
    raise UsageError(f"--confidence must be in (0, 1], got {a.confidence}.")
  if a.max_new_tokens < 1:
    raise UsageError(f"--max_new_tokens must be >= 1, got {a.max_new_tokens}.")
  if a.prompt is not None and a.prompt_file is not None:
    raise UsageError("Give --prompt or --prompt_file, not both.")
  if a.stream_steps < 1:
    raise UsageError(f"--stream_steps must be >= 1, got {a.stream_steps}.")


def read_prompt_lines(a: DecodeArgs, stdin: TextIO) -> list[str]:
  if a.prompt is not None:
    lines = [a.prompt]
  elif a.prompt_file is not None:
    try:
      with open(a.prompt_file) as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    except OSError as e:
      raise UsageError(f"Cannot read --prompt_file {a.prompt_file}: {e.strerror}.") from e
  else:
    lines = [line.rstrip("\n") for line in stdin if line.strip()]
  if not lines or all(not line.strip() for line in lines):
    raise UsageError("The prompt is empty: pass --prompt, --prompt_file, or text on stdin.")
  return lines


def parse_token_ids(line: str, index: int) -> list[int]:
  try:
    ids = [int(x) for x in line.replace(" ", "").split(",") if x != ""]
  except ValueError as e:
    raise UsageError(f"Prompt {index} is not a comma-separated list of token ids: {line!r}.") from e
  if not ids:
    raise UsageError(f"Prompt {index} is empty.")
  return ids


# --- output --------------------------------------------------------------------------------------

def _color(prob: float) -> str:
  """ANSI 256-color code: green (sure) .. red (unsure)."""
  for threshold, code in ((0.8, 34), (0.5, 148), (0.25, 214)):
    if prob >= threshold:
      return f"\x1b[38;5;{code}m"
  return "\x1b[38;5;196m"


def render_groups(groups: Sequence[Sequence[int]], logprobs: Sequence[float],
                  piece: Callable[[int], str], color: bool, sep: str = "") -> str:
  """Each group as [..] (plain) or closed by a dim bar with tokens colored by probability.

  `sep` goes between tokens and between groups (" " for token ids, "" for text pieces).
  """
  out, i = [], 0
  for group in groups:
    if color:
      body = sep.join(f"{_color(math.exp(logprobs[i + k]))}{piece(t)}"
                      for k, t in enumerate(group))
      out.append(f"{body}\x1b[0m\x1b[2m|\x1b[0m")
    else:
      out.append("[" + sep.join(piece(t) for t in group) + "]")
    i += len(group)
  return sep.join(out)


class Printer:
  """Formats one row's tokens as text or ids, with or without group marks."""

  def __init__(self, tokenizer: Tokenizer | None, show_groups: bool, color: bool):
    self.tok, self.show_groups, self.color = tokenizer, show_groups, color
    self.sep = " " if tokenizer is None else ""

  def piece(self, t: int) -> str:
    return str(t) if self.tok is None else self.tok.decode([t], skip_special=False)

  def groups(self, groups, logprobs) -> str:
    return render_groups(groups, logprobs, self.piece, self.color, self.sep)

  def full(self, tokens, groups, logprobs) -> str:
    if self.show_groups:
      return self.groups(groups, logprobs)
    if self.tok is None:
      return ",".join(str(t) for t in tokens)
    return self.tok.decode(tokens)


def _stream_one(sampler: Sampler, prompt, printer: Printer, knobs: dict, a: DecodeArgs,
                out: TextIO) -> DecodeResult:
  """Decodes one prompt in chunks of macro steps, printing as text appears."""
  text = TextStream(printer.tok) if printer.tok and not printer.show_groups else None
  shown_groups = shown_tokens = 0
  result = None
  for result in sampler.stream([prompt], chunk_steps=a.stream_steps, **knobs):
    tokens, groups = result.tokens[0], result.groups(0)
    final = result.finish_reasons[0] != "running"
    if text is not None:
      out.write(text.update(tokens, final))
    elif printer.show_groups:
      start = sum(len(g) for g in groups[:shown_groups])
      if len(groups) > shown_groups:
        out.write((printer.sep if shown_groups else "") +
                  printer.groups(groups[shown_groups:], result.logprobs[0][start:]))
      shown_groups = len(groups)
    else:
      out.write(("," if shown_tokens else "") + ",".join(str(t) for t in tokens[shown_tokens:]))
      shown_tokens = len(tokens)
    out.flush()
  out.write("\n")
  return result


def _summary(stats: dict) -> str:
  return (f"{stats['new_tokens']} new tokens in {stats['macro_steps']} macro steps "
          f"({stats['tokens_per_macro_step']:.2f} tokens/step); KV slots {stats['kv_slots_used']} "
          f"(plain decoding: {stats['kv_slots_base']}); prefill {stats['prefill_s'] * 1e3:.1f} ms; "
          f"decode {stats['decode_tokens_per_s']:.1f} tokens/s; "
          f"compile {stats['compile_s']:.1f} s; "
          f"finish {','.join(stats['finish_reasons'])}")


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


SHIPPED = "smollm2"   # --ckpt name of the shipped HAMburger-SmolLM2 (hamburger_jax/assets)


def _load(a: DecodeArgs):
  """-> (config, params, base_only) from any supported checkpoint."""
  if a.ckpt == SHIPPED:
    from hamburger_jax.recipes import smollm2
    try:
      cfg, params, _, _ = smollm2.load_shipped()
    except FileNotFoundError as e:
      raise CheckpointError(str(e)) from e
    return cfg, params, a.base
  try:
    kind, cfg, params = load_model(a.ckpt, base_config=a.base_config)
  except (FileNotFoundError, ValueError) as e:
    if isinstance(e, CheckpointError):
      raise
    raise CheckpointError(str(e)) from e
  return cfg, params, a.base or kind == "llama"


def _run(a: DecodeArgs, stdout: TextIO, stderr: TextIO, stdin: TextIO) -> int:
  check_args(a)
  if a.make_tiny_checkpoint:
    make_tiny_checkpoint(a.make_tiny_checkpoint, a.seed)
    print(a.make_tiny_checkpoint, file=stdout)
    return 0
  if a.ckpt != SHIPPED and not os.path.exists(a.ckpt):
    raise CheckpointError(f"No such checkpoint: {a.ckpt} (pass an export dir, an HF Llama dir, an "
                          "original HAMburger checkpoint, or 'smollm2').")
  lines = read_prompt_lines(a, stdin)
  tokenizer = None
  if a.ckpt == SHIPPED:
    from hamburger_jax.recipes import smollm2
    a = dataclasses.replace(a, chat=True, system=a.system or smollm2.SYSTEM_PROMPT,
                            tokenizer=a.tokenizer or smollm2.cached_tokenizer_dir())
  if not a.token_ids:
    tok_path = a.tokenizer or (a.ckpt if os.path.isdir(a.ckpt) else os.path.dirname(a.ckpt))
    if not a.tokenizer and not os.path.isfile(os.path.join(tok_path, "tokenizer.json")):
      raise UsageError("No tokenizer: pass --tokenizer PATH/tokenizer.json, or --token_ids to give "
                       "prompts as comma-separated ids.")
    tokenizer = Tokenizer(tok_path)
  cfg, params, base_only = _load(a)
  if a.token_ids:
    prompts = [parse_token_ids(line, i) for i, line in enumerate(lines)]
  else:
    prompts = [tokenizer.encode(line, chat=a.chat, system=a.system) for line in lines]
  llama = cfg.base if isinstance(cfg, HamburgerConfig) else cfg
  eos = list(llama.eos_token_ids) + (tokenizer.stop_ids(a.chat) if tokenizer else [])
  longest = max(len(p) for p in prompts)
  cache_length = a.cache_length or -(-(longest + a.max_new_tokens) // 64) * 64
  sampler = Sampler(cfg, params, base=base_only, cache_length=cache_length,
                    out_length=-(-a.max_new_tokens // 64) * 64, eos_ids=sorted(set(eos)))
  knobs = dict(max_new_tokens=a.max_new_tokens, confidence=a.confidence,
               temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed,
               max_group=(a.max_group or None) if not base_only else None)
  sampler.check_prompts(prompts)
  color = a.show_groups and not a.json and stdout.isatty()
  printer = Printer(tokenizer, a.show_groups, color)
  base_result = None
  if a.compare_base and not base_only:
    base_sampler = Sampler(cfg, params, base=True, cache_length=cache_length,
                           out_length=sampler.engine.out_length, eos_ids=sorted(set(eos)))
    base_knobs = dict(knobs, max_group=None, confidence=1.0)
    base_sampler.decode(prompts, **base_knobs)                # compile once, then time
    base_result = base_sampler.decode(prompts, **base_knobs)
    sampler.decode(prompts, **knobs)                          # compile before the timed run
  if len(prompts) == 1 and not a.json and base_result is None:   # timed runs do not stream
    result = _stream_one(sampler, prompts[0], printer, knobs, a, stdout)
  else:
    result = sampler.decode(prompts, **knobs)
    if not a.json:
      for i in range(len(prompts)):
        print(f"### {i}", file=stdout)
        print(printer.full(result.tokens[i], result.groups(i), result.logprobs[i]), file=stdout)
  stats = result.stats()
  stats["mode"] = "base" if base_only else "hamburger"
  if base_result is not None:
    stats["base"] = _comparison(result, base_result)
  if a.json:
    rows = []
    for i, prompt in enumerate(prompts):
      row = {"prompt_ids": prompt, "tokens": result.tokens[i], "groups": result.groups(i),
             "finish_reason": result.finish_reasons[i],
             "probs": [round(math.exp(x), 6) for x in result.logprobs[i]]}
      if tokenizer is not None:
        row["text"] = tokenizer.decode(result.tokens[i])
      rows.append(row)
    jsonlib.dump({"outputs": rows, "stats": stats}, stdout)
    stdout.write("\n")
  else:
    print(_summary(stats), file=stderr)
    if base_result is not None:
      b = stats["base"]
      if tokenizer is not None and len(prompts) == 1:
        print(f"--- base model alone:\n{tokenizer.decode(base_result.tokens[0])}", file=stdout)
      print(f"base model alone: {b['decode_tokens_per_s']:.1f} tokens/s; HAMburger/base speed "
            f"{b['speed_ratio']:.2f}x; KV entries {b['kv_slots_hamburger']} vs {b['kv_slots']}; "
            f"token agreement with the base {b['token_agreement']:.2f}", file=stderr)
  return 0


def _comparison(result: DecodeResult, base: DecodeResult) -> dict:
  """Stats of the base-only run beside HAMburger's (same prompts, same process)."""
  ours, theirs = result.stats(), base.stats()
  same = sum(int(x == y) for r, q in zip(result.tokens, base.tokens) for x, y in zip(r, q))
  total = sum(max(len(r), len(q)) for r, q in zip(result.tokens, base.tokens))
  return {"new_tokens": theirs["new_tokens"], "decode_tokens_per_s": theirs["decode_tokens_per_s"],
          "speed_ratio": ours["decode_tokens_per_s"] / max(theirs["decode_tokens_per_s"], 1e-9),
          "kv_slots": theirs["kv_slots_used"], "kv_slots_hamburger": ours["kv_slots_used"],
          "token_agreement": same / max(total, 1)}


# --- absl flags (used by decode.py) -------------------------------------------------------------

_HELP = {
    "ckpt": "hamburger_jax export dir, HF Llama dir (plain decoding), original HAMburger "
            "checkpoint file (with --base_config), or 'smollm2' (the shipped model)",
    "base_config": "HF config.json of the base model, for an original HAMburger checkpoint",
    "tokenizer": "tokenizer.json or its directory (default: beside --ckpt)",
    "prompt": "one prompt (comma-separated ids with --token_ids); also accepted as a positional "
              "argument; default: stdin, one prompt per line",
    "prompt_file": "file with one prompt per line (decoded as one batch)",
    "token_ids": "prompts are comma-separated token ids and output is ids (no tokenizer)",
    "chat": "wrap prompts in the chat template (Llama-3 headers or ChatML)",
    "system": "system message for --chat",
    "max_new_tokens": "exact maximum of generated tokens per prompt",
    "confidence": "in (0, 1]: a group goes on while 1 - sigmoid(stop logit) >= confidence",
    "temperature": "sampling temperature (0 = greedy)",
    "top_k": "keep the k most likely tokens (0 = off)",
    "top_p": "nucleus sampling mass (1 = off)",
    "max_group": "cap on tokens per macro step (0 = the model's max_steps; 1 = base-equivalent)",
    "seed": "sampling seed",
    "base": "plain base-model decoding, one token per step (the speed baseline)",
    "show_groups": "mark each macro step's group; colored by token probability on a terminal",
    "json": "print outputs and stats as JSON",
    "cache_length": "KV slots per row (0 = longest prompt + max_new_tokens, rounded up to 64)",
    "stream_steps": "macro steps per streamed chunk",
    "make_tiny_checkpoint": "write a random tiny HAMburger checkpoint to this directory and exit",
    "compare_base": "also decode with the base model alone in the same run; print its text and "
                    "the speed / KV-entry ratios",
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
