r"""Where HAMburger's quality goes: held-out teacher-forced accuracy of each micro step, split by the
size of the group fed at that macro position, beside the base model reading the same tokens unmerged.

    python -m experiments.merged_context --data_dir runs/smollm2/data --name smollm2_sft
    python -m experiments.merged_context --asset_dir runs/smollm2_v6/asset --data_dir ... --out r.json

Micro step 0 is the base model's own next-token prediction (its final-normed output through the LM
head), so its accuracy measures how well the base reads the merged context; steps >= 1 are the
micro decoder's drafts. The base row decodes the same targets from the plain token sequence. The
targets of a self-distilled dataset are the base's greedy answers, so the base row is close to 1.
Prints JSON and a table; writes the JSON with "provenance" to --out (default
docs/results/data/training/merged_context.json).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from benchmarks.common import markdown_table, results_dir, write_json


def unmerge(batch: dict[str, np.ndarray], length: int):
  """A packed macro batch -> the plain token rows the base model would read (fed groups, then
  each example's last target group).

  Returns tokens, positions, segment_ids [B, length] and last [B, M]: the index in the plain row
  of the last token of the group fed at each macro position (-1 for padding).
  """
  b_rows, m_len, _ = batch["group_tokens"].shape
  tokens, positions, segments = (np.zeros((b_rows, length), np.int32) for _ in range(3))
  last = np.full((b_rows, m_len), -1, np.int64)
  for b in range(b_rows):
    n, segment, pos = 0, None, 0
    for m in range(m_len):
      size, seg = int(batch["group_lengths"][b, m]), int(batch["segment_ids"][b, m])
      if seg == 0 or size == 0:
        continue
      if seg != segment:
        segment, pos = seg, 0
      groups = [batch["group_tokens"][b, m, :size]]
      ends_segment = m + 1 == m_len or int(batch["segment_ids"][b, m + 1]) != seg
      if ends_segment:             # the example's last group is only a target: append it
        groups.append(batch["target_tokens"][b, m, :int(batch["target_lengths"][b, m])])
      for k, group in enumerate(groups):
        size = len(group)
        if n + size > length:
          raise ValueError(f"row {b} needs more than {length} plain tokens: raise "
                           "--plain_length.")
        tokens[b, n:n + size] = group
        positions[b, n:n + size] = np.arange(pos, pos + size)
        segments[b, n:n + size] = seg
        n, pos = n + size, pos + size
        if k == 0:
          last[b, m] = n - 1
  return tokens, positions, segments, last


def _load(args):
  if args.ckpt:
    from hamburger_jax.convert import load_model
    kind, cfg, params = load_model(args.ckpt)
    if kind != "hamburger":
      raise SystemExit(f"{args.ckpt} is a plain base model: pass a HAMburger checkpoint.")
    return cfg, params
  from hamburger_jax.shipped import smollm2
  cfg, params, _, _ = smollm2.load_shipped(args.asset_dir or smollm2.ASSET_DIR)
  return cfg, params


def measure(args) -> dict:
  import jax
  import jax.numpy as jnp
  from hamburger_jax import data as data_lib
  from hamburger_jax.model.hamburger import HamburgerModel, gather_target_positions
  from hamburger_jax.model.llama import LlamaModel

  cfg, params = _load(args)
  s = cfg.max_steps
  pipe = data_lib.PipelineConfig(data_dir=args.data_dir, name=args.name, split=args.split,
                                 seq_len=args.seq_len, num_rows=args.rows, max_steps=s,
                                 shuffle=False, num_epochs=1)
  model, base = HamburgerModel(cfg), LlamaModel(cfg.base)

  @jax.jit
  def hamburger_predictions(p, batch):
    out = model.apply({"params": p}, batch, max_targets=args.seq_len)
    idx = gather_target_positions(batch, args.seq_len)
    return (jnp.argmax(out.logits, -1), out.target_tokens, out.target_lengths,
            jnp.take_along_axis(batch["group_lengths"], idx, axis=1), idx)

  @jax.jit
  def base_predictions(p, tokens, positions, segments):
    return jnp.argmax(base.apply({"params": p}, tokens, positions=positions,
                                 segment_ids=segments).logits, -1)

  counts = {"hamburger": np.zeros((s, s + 1, 2)), "base": np.zeros((s, 2))}
  for i, batch in enumerate(data_lib.make_iterator(pipe)):
    if i >= args.batches:
      break
    pred, tgt, tl, fed, idx = map(np.asarray, hamburger_predictions(
        params, {k: jnp.asarray(v) for k, v in batch.items()}))
    tokens, positions, segments, last = unmerge(batch, args.plain_length)
    base_pred = np.asarray(base_predictions(params["base"], jnp.asarray(tokens),
                                            jnp.asarray(positions), jnp.asarray(segments)))
    last = np.take_along_axis(last, idx, axis=1)
    for j in range(s):
      has = tl > j
      right = pred[..., j] == tgt[..., j]
      for size in range(1, s + 1):
        sel = has & (fed == size)
        counts["hamburger"][j, size] += (right[sel].sum(), sel.sum())
      rows, cols = np.nonzero(has)
      base_right = base_pred[rows, last[rows, cols] + j] == tgt[rows, cols, j]
      counts["base"][j] += (base_right.sum(), len(rows))
  ratio = lambda c: float(c[0] / c[1]) if c[1] else None
  return {
      "model": args.ckpt or args.asset_dir or "shipped", "data": f"{args.data_dir}:{args.name}/"
      f"{args.split}", "batches": args.batches,
      "hamburger": [{"step": j, "accuracy": ratio(counts["hamburger"][j, 1:].sum(0)),
                     "by_fed_size": {str(k): {"accuracy": ratio(counts["hamburger"][j, k]),
                                              "targets": int(counts["hamburger"][j, k, 1])}
                                     for k in range(1, s + 1)}} for j in range(s)],
      "base": [{"step": j, "accuracy": ratio(counts["base"][j]),
                "targets": int(counts["base"][j, 1])} for j in range(s)],
  }


def table(result: dict) -> str:
  s = len(result["base"])
  fmt = lambda x: "-" if x is None else f"{x:.3f}"
  rows = []
  for h, b in zip(result["hamburger"], result["base"]):
    by = h["by_fed_size"]
    rows.append([h["step"], fmt(b["accuracy"]), fmt(h["accuracy"])]
                + [f"{fmt(by[str(k)]['accuracy'])} ({by[str(k)]['targets']})"
                   for k in range(1, s + 1)])
  return markdown_table(["micro step", "base (unmerged)", "HAMburger"]
                        + [f"after a group of {k}" for k in range(1, s + 1)], rows)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--asset_dir", default=None, help="SmolLM2 grafted weights (default: shipped)")
  p.add_argument("--ckpt", default=None, help="or a full HAMburger checkpoint")
  p.add_argument("--data_dir", required=True, help="prepared dataset directory")
  p.add_argument("--name", default="smollm2_sft")
  p.add_argument("--split", default="validation")
  p.add_argument("--batches", type=int, default=4)
  p.add_argument("--rows", type=int, default=8)
  p.add_argument("--seq_len", type=int, default=256)
  p.add_argument("--plain_length", type=int, default=1024, help="plain tokens per row at most")
  p.add_argument("--out", default=os.path.join(results_dir("training"), "merged_context.json"),
                 help="JSON output path ('' = print only)")
  args = p.parse_args(argv)
  result = measure(args)
  write_json(result, args.out, __spec__.name, argv)
  print(json.dumps(result))
  print(table(result))


if __name__ == "__main__":
  main()
