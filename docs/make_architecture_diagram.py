"""Draws docs/architecture.png: one HAMburger macro step (embedder -> base -> micro decoder).

    python docs/make_architecture_diagram.py                 # rewrites docs/architecture.png
    python docs/make_architecture_diagram.py --out /tmp/a.png

Only matplotlib (requirements.txt); the drawing is plain boxes and arrows in data coordinates
(x 0..100, y 0..60), so a change to the picture is a change to the numbers below.
"""

from __future__ import annotations

import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "architecture.png")

GRAFTED = "#fde2b8"   # trained modules
FROZEN = "#cfe2f3"    # the base model (frozen in the shipped recipe)
DATA = "#eeeeee"      # tokens, vectors, buffers
NEW = "#d9ead3"       # what this macro step writes or emits
EDGE = "#444444"


def box(ax, x, y, w, h, text, color, size=9, bold=False):
  """A rounded box with centred text; (x, y) is its lower-left corner."""
  ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.25,rounding_size=0.8",
                              facecolor=color, edgecolor=EDGE, linewidth=1.0))
  ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
          fontweight="bold" if bold else "normal", linespacing=1.25)


def arrow(ax, start, end, text="", style="-|>", rad=0.0, size=8, offset=(0.0, 1.2)):
  """An arrow from start to end (data coordinates), with an optional label near its middle."""
  ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=EDGE,
                               linewidth=1.1, connectionstyle=f"arc3,rad={rad}"))
  if text:
    mx, my = (start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1]
    ax.text(mx, my, text, ha="center", va="bottom", fontsize=size, color="#222222")


def kv_buffer(ax, y):
  """The fixed-shape KV buffer of one row: slot = macro step, position = last token's."""
  ax.text(1, y + 7.0, "KV buffer of one row: fixed shape, L slots per layer (model/attention.py "
          "init_cache; decode attention reads the filled blocks only, model/kv_attention.py)",
          fontsize=9, fontweight="bold")
  cells = [("slot 0\npos 0\nprompt", DATA), ("slot 1\npos 1\nprompt", DATA), ("…", DATA),
           ("slot T-1\npos T-1\nprompt", DATA), ("slot T\npos T+1\ngroup of 2", DATA),
           ("slot n\npos p\nthis group", NEW), ("empty", "white"), ("…", "white"),
           ("slot L-1", "white")]
  for i, (label, color) in enumerate(cells):
    box(ax, 1 + i * 10.8, y, 9.6, 5.4, label, color, size=7.5)


def macro_step(ax, y):
  """Pending group -> embedder -> base -> features -> micro decoder."""
  for i, tok in enumerate(["t₁", "t₂", "t₃"]):
    box(ax, 1.5 + i * 4.2, y + 2.5, 3.2, 3.2, tok, DATA, size=10)
  ax.text(7.8, y + 8.2, "pending group\n(k = 3 tokens)", ha="center", fontsize=8)
  box(ax, 16.6, y + 0.5, 16.4, 7.5, "compositional\nembedder\nmean(E) + out_proj(attn(E))\n"
      "model/embedder.py", GRAFTED, size=8)
  arrow(ax, (14.5, y + 4.2), (16.6, y + 4.2))
  box(ax, 36, y + 2.6, 4, 3.2, "x", DATA, size=10)
  ax.text(38, y + 7.0, "ONE input\nvector", ha="center", fontsize=8)
  arrow(ax, (33.4, y + 4.2), (35.6, y + 4.2))
  box(ax, 44, y - 0.5, 17, 9.5, "base Llama (frozen)\nreads x at slot n,\nRoPE position p =\n"
      "position of t₃\nmodel/llama.py", FROZEN, size=8.5)
  arrow(ax, (40.4, y + 4.2), (43.6, y + 4.2))
  box(ax, 65, y + 0.5, 10, 7.5, "features\nlayer taps +\nfinal norm", DATA, size=8.5)
  arrow(ax, (61.4, y + 4.2), (64.6, y + 4.2))
  box(ax, 79, y - 0.5, 20, 9.5, "micro-step decoder\nLlama layers, own weights,\nfresh micro "
      "KV cache\nmodel/micro_decoder.py", GRAFTED, size=8.5)
  arrow(ax, (75.4, y + 4.2), (78.6, y + 4.2))
  return (52.5, y + 9.4), (89, y - 0.9)


def micro_steps(ax, y):
  """Micro steps 0..3 -> tokens + stop decisions -> the emitted group."""
  labels = ["j = 0\nbase's own\nnext token", "j = 1\ndraft", "j = 2\ndraft", "j = 3\ndraft"]
  for j, label in enumerate(labels):
    x = 57 + j * 10.8
    box(ax, x, y, 9.2, 6.4, label, GRAFTED if j else FROZEN, size=8)
    box(ax, x, y - 6.8, 9.2, 4.0, f"y{'₀₁₂₃'[j]}  stop?", NEW, size=9)
    arrow(ax, (x + 4.6, y - 0.2), (x + 4.6, y - 2.6))
    if j:
      arrow(ax, (x - 1.8, y - 4.8), (x - 0.4, y + 3.2), rad=-0.3)
  ax.text(57, y - 10.5, "LM head + stop head read every micro output (no extra norm)",
          fontsize=8)
  rules = ("a draft joins only if its probability >= min_token_prob;\n"
           "the group goes on while 1 - sigmoid(stop) >= confidence;\n"
           "a ``` token or EOS ends it; at most S = 4 tokens;\n"
           "drafts may choose from a draft vocabulary (decode/draft_vocab.py)")
  ax.text(57, y - 13.0, rules, fontsize=8, va="top", linespacing=1.4)
  box(ax, 30, y - 11.0, 22, 5.0, "emitted group: up to 4 tokens\n(decode/loop.py _decode_group)",
      NEW, size=8.5)
  arrow(ax, (57.2, y - 4.8), (52.4, y - 8.5), rad=0.15)
  arrow(ax, (29.6, y - 8.5), (7.8, y + 11.8), rad=-0.3)
  ax.text(15, y + 0.5, "fed back at the next macro step:\nslot n + 1, position p + its length",
          fontsize=8, va="center", ha="left")


def draw(out: str) -> str:
  fig, ax = plt.subplots(figsize=(13, 8.4))
  ax.set_xlim(0, 100)
  ax.set_ylim(-12, 60)
  ax.axis("off")
  ax.text(1, 57.5, "One HAMburger macro step (decode/loop.py _macro_step, inside ONE jitted "
          "lax.while_loop)", fontsize=12, fontweight="bold")
  kv_buffer(ax, 45)
  writes, feeds = macro_step(ax, 26)
  arrow(ax, writes, (59.8, 44.7), text="K/V written at slot n", offset=(7.5, -1.5), size=8)
  micro_steps(ax, 14)
  arrow(ax, feeds, (89, 20.8))
  handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor=EDGE) for c in
             (FROZEN, GRAFTED, NEW)]
  ax.legend(handles, ["base model (frozen)", "grafted, trained", "written / emitted this step"],
            loc="lower left", fontsize=8, frameon=False)
  fig.savefig(out, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return out


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", default=OUT, help="PNG (or .svg) to write")
  print(draw(p.parse_args(argv).out))


if __name__ == "__main__":
  main()
