"""Broad offline instruction prompts: chat, facts, explanations, code, lists, maths, rewriting...

Built only from data that ships with Python or with installed, permissively licensed packages
(SOURCES names each one and its licence): nothing is downloaded. Templates are filled with items
(a country, a city's time zone, a colour, a sentence of the Python docs, two numbers...). A
prompt's split comes from hashes of its items (stdlib_prompts.split_of): it is held out when any
of its items is, so a held-out item never appears in a training prompt of any kind.

    python -m hamburger_jax.recipes.broad_prompts --workdir runs/smollm2_v2 --num_train 10000 \
        --num_heldout 300 --mix_stdlib 1000

More prompts later, none already answered: add `--exclude_answered` with the distilled answers
(JSONL, .gz or plain, each line's "prompt").
"""

from __future__ import annotations

import argparse
import builtins
import calendar
import contextlib
import hashlib
import http
import io
import itertools
import json
import keyword
import locale
import mimetypes
import os
import random
import re
import sys
import unicodedata

from hamburger_jax.recipes.stdlib_prompts import split_of

HELDOUT_FRACTION = 0.05
MAX_CHARS = 330          # with ChatML and the default system prompt: <= 128 SmolLM2 tokens
SOURCES = {
    "python": "Python standard library data (pydoc_data.topics, this, keyword, builtins, "
              "calendar, http.HTTPStatus, mimetypes, locale.locale_alias, "
              "sys.stdlib_module_names): PSF-2.0",
    "unicode": "Unicode character names (Python's unicodedata): Unicode-3.0",
    "tzdata": "tzdata (PyPI) zone.tab and iso3166.tab: Apache-2.0 package, IANA public-domain data",
    "pygments": "Pygments lexer (language) names: BSD-2-Clause",
    "scipy": "scipy.constants.physical_constants names (CODATA): BSD-3-Clause",
    "matplotlib": "matplotlib XKCD colour names (XKCD survey, CC0): matplotlib licence (PSF-based)",
    "generated": "numbers, lists and dates drawn with a fixed seed",
}
POOL_SOURCE = {"country": "tzdata", "city": "tzdata", "lang": "pygments", "constant": "scipy",
               "color": "matplotlib", **dict.fromkeys(("animal", "food", "thing"), "unicode"),
               **dict.fromkeys(("ab", "n", "pct", "lin", "nums", "date", "year"), "generated")}

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "broad_templates.txt")


def _stable_hash(text: str) -> int:
  return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16)


def _article(word: str) -> str:
  """ "an " before a vowel sound ("an elephant", "a unicorn"), else "a "."""
  return "an " if re.match(r"[aei]|o(?!ne)|u(?!ni|se|ku)", word.lower()) else "a "


def _tab(name: str) -> list[list[str]]:
  """Rows of one of tzdata's .tab files."""
  import tzdata
  with open(os.path.join(os.path.dirname(tzdata.__file__), "zoneinfo", name),
            encoding="utf-8") as f:
    return [line.rstrip("\n").split("\t") for line in f if not line.startswith("#")]


def _emoji(ranges, drop: str = "") -> list[str]:
  """Lower-case Unicode names in code point ranges, minus those matching the regex `drop`."""
  names = [unicodedata.name(chr(c), "").lower().removesuffix(" face")
           for lo, hi in ranges for c in range(lo, hi + 1)]
  return list(dict.fromkeys(n for n in names if n and not (drop and re.search(drop, n))))


def _prose():
  """-> (paragraphs, sentences) of pydoc_data.topics prose, and the Zen of Python's lines."""
  from pydoc_data.topics import topics
  with contextlib.redirect_stdout(io.StringIO()):
    import this
  paragraphs, sentences = [], []
  for name in sorted(topics):
    for para in topics[name].split("\n\n"):
      text = " ".join(para.split())
      if not para[:1].isalpha() or "::" in para or re.search(r"\n\s", para):
        continue
      key = f"para:{_stable_hash(text):x}"
      if 100 <= len(text) <= 300 and text.endswith("."):
        paragraphs.append({"text": text, "_key": key})
      sentences += [{"sentence": s, "_key": key} for s in re.split(r"(?<=\.) (?=[A-Z])", text)
                    if 40 <= len(s) <= 180 and s.endswith(".") and "*" not in s]
  zen = "".join(this.d.get(c, c) for c in this.s).splitlines()[2:]
  return paragraphs, sentences + [{"sentence": s} for s in zen if s]


def _python_pools() -> dict[str, list]:
  from pydoc_data.topics import topics
  names = {k: getattr(builtins, k) for k in dir(builtins) if not k.startswith("_")}
  is_exc = {k: isinstance(v, type) and issubclass(v, BaseException) for k, v in names.items()}
  not_languages = {"american", "cextend", "japan", "posix", "univ", "universal", "bokmal",
                   "dansk", "deutsch", "eesti", "galego", "hrvatski", "nynorsk", "rumanian",
                   "serbocroatian", "slovene"}
  languages = sorted({k for k in locale.locale_alias if k.isascii() and k.isalpha()
                      and len(k) > 3} - not_languages)
  return {
      "month": list(calendar.month_name[1:]), "weekday": list(calendar.day_name),
      "keyword": [k for k in keyword.kwlist + keyword.softkwlist if k != "_"],
      "builtin": [k for k in names if not is_exc[k]],
      "exception": [k for k in names if is_exc[k]],
      "module": [m for m in sorted(sys.stdlib_module_names) if not m.startswith("_")],
      "topic": [t[0].lower() + t[1:] for t in (topics[k].split("\n")[0] for k in sorted(topics))],
      "language": [k.capitalize() for k in languages],
      "http": [{"code": s.value, "phrase": s.phrase} for s in http.HTTPStatus],
      "mime": [{"ext": e.lstrip("."), "mime": t}
               for e, t in sorted(mimetypes.MimeTypes().types_map[True].items())],
  }


def _package_pools() -> dict[str, list]:
  from matplotlib import _color_data
  from pygments.lexers import get_all_lexers
  from scipy.constants import physical_constants
  langs = {name for name, _, files, _ in get_all_lexers() if files and not re.search(
      r"\w\+\w|session|console|traceback|output|lexer|\blog\b|text", name, re.I)}
  return {
      "country": [row[1] for row in _tab("iso3166.tab")],
      "city": [{"tz": row[2], "city": row[2].rsplit("/", 1)[1].replace("_", " ")}
               for row in _tab("zone.tab")],
      "lang": sorted(langs),
      "constant": [c for c in physical_constants if len(c) <= 45 and " in " not in c],
      "color": [c[5:] for c in _color_data.XKCD_COLORS],
      "animal": _emoji([(0x1F400, 0x1F43C), (0x1F980, 0x1F9AD)]),
      "food": _emoji([(0x1F345, 0x1F37F), (0x1F950, 0x1F96F), (0x1FAD0, 0x1FADB)],
                     r"fork|chopstick|spoon|cooking|baby|box|pot of|pan of|swirl|canned|mug|cup"
                     r"|glass|bottle|steaming"),
      "thing": _emoji([(0x1F380, 0x1F3CA), (0x1F4A0, 0x1F4FF), (0x1FA70, 0x1FAAF)],
                      r"symbol|sign|arrow|with|face|person|hand|poo|\bno\b|\boff\b|pointing"),
  }


def _draw(name: str, n: int, make) -> list[dict]:
  """n distinct items from make(rng), rng seeded by the pool's name."""
  rng, out = random.Random(name), {}
  for _ in range(20 * n):
    item = make(rng)
    out.setdefault(json.dumps(item), item)
    if len(out) == n:
      break
  return list(out.values())


def _generated_pools() -> dict[str, list]:
  def nums(rng):
    xs = [str(rng.randint(1, 100)) for _ in range(rng.randint(4, 7))]
    return {"nums": ", ".join(xs[:-1]) + " and " + xs[-1]}

  def lin(rng):
    k, x, m = rng.randint(2, 12), rng.randint(-10, 20), rng.randint(1, 50)
    return {"k": k, "m": m, "c": k * x + m}

  def date(rng):
    y, mo = rng.randint(1900, 2030), rng.randint(1, 12)
    day = rng.randint(1, calendar.monthrange(y, mo)[1])
    return {"date": f"{calendar.month_name[mo]} {day}, {y}"}

  return {"ab": _draw("ab", 1500, lambda r: {"a": r.randint(2, 99), "b": r.randint(2, 99)}),
          "n": _draw("n", 1000, lambda r: {"n": r.randint(2, 3999)}),
          "pct": _draw("pct", 500, lambda r: {"p": 5 * r.randint(1, 19),
                                               "total": 10 * r.randint(1, 100)}),
          "lin": _draw("lin", 800, lin), "nums": _draw("nums", 800, nums),
          "date": _draw("date", 600, date),
          "year": _draw("year", 400, lambda r: {"year": r.randint(1582, 2400)})}


def pools() -> dict[str, list[dict]]:
  """Every pool's items as dicts of template fields; "_key" names the item for the split."""
  paragraphs, sentences = _prose()
  raw = {**_python_pools(), **_package_pools(), **_generated_pools(),
         "text": paragraphs, "sentence": sentences}
  out = {}
  for name, items in raw.items():
    items = [it if isinstance(it, dict) else {name: it} for it in items]
    for it in items:   # an item's key is its text, whatever pool it is in
      it.setdefault("_key", "/".join(str(v).lower() for v in it.values()))
    out[name] = items
  return out


def templates(path: str = TEMPLATES) -> list[tuple[str, tuple[str, ...], str]]:
  """-> [(kind, pools, template)] from the templates file."""
  out, head = [], None
  with open(path, encoding="utf-8") as f:
    for line in (raw.rstrip("\n") for raw in f if raw.strip() and not raw.startswith("#")):
      if line.startswith("["):
        head = (line.strip("[]").split()[0], tuple(line.strip("[]").split()[1:]))
      else:
        out.append((*head, line))
  return out


def broad_prompts() -> list[dict]:
  """All prompts, deterministic: {prompt, kind, source, split, item, template}."""
  all_pools, seen, out = pools(), set(), []
  for t_index, (kind, names, template) in enumerate(templates()):
    source = "+".join(sorted({POOL_SOURCE.get(n, "python") for n in names}))
    for item in all_pools[names[0]]:
      items = [item] + [all_pools[n][_stable_hash(f"{template}|{item['_key']}") % len(
          all_pools[n])] for n in names[1:]]
      fields = {k: v for it in items for k, v in it.items()}
      prompt = re.sub(r"\ba (?=\{(\w+)\})", lambda m: _article(str(fields[m[1]])),
                      template).format(**fields)
      if len(prompt) > MAX_CHARS or prompt in seen:
        continue
      seen.add(prompt)
      keys = [it["_key"] for it in items]
      held = any(split_of(k, HELDOUT_FRACTION) == "heldout" for k in keys)
      out.append({"prompt": prompt, "kind": kind, "source": source,
                  "split": "heldout" if held else "train", "item": "|".join(keys),
                  "template": t_index})
  return out


# --- selection and the CLI ------------------------------------------------------------------------

def _interleave(groups: list[list]) -> list:
  """Round robin over the groups: any prefix is balanced between them."""
  return [x for row in itertools.zip_longest(*groups) for x in row if x is not None]


def balanced(prompts: list[dict], n: int, rng: random.Random) -> list[dict]:
  """n prompts, kinds as equal as possible (and, within a kind, templates)."""
  by_kind: dict = {}
  for p in prompts:
    by_kind.setdefault(p["kind"], {}).setdefault(p.get("template", -1), []).append(p)
  per_kind = []
  for kind in sorted(by_kind):
    groups = [by_kind[kind][t] for t in sorted(by_kind[kind])]
    for g in groups:
      rng.shuffle(g)
    per_kind.append(_interleave(groups))
  return _interleave(per_kind)[:n]


def distill_order(prompts: list[dict], rng: random.Random, block: int = 512) -> list[dict]:
  """Shuffled, then sorted by length within blocks (less padding in batched decoding)."""
  prompts = list(prompts)
  rng.shuffle(prompts)
  return [p for i in range(0, len(prompts), block)
          for p in sorted(prompts[i:i + block], key=lambda p: len(p["prompt"]))]


def fitting(prompts: list[dict], max_tokens: int) -> list[dict]:
  """The prompts of at most max_tokens SmolLM2 tokens in ChatML with the default system prompt."""
  from hamburger_jax.recipes import smollm2
  from hamburger_jax.text.tokenizer import Tokenizer
  tok = Tokenizer(smollm2.cached_tokenizer_dir())
  return [p for p in prompts
          if len(tok.encode(p["prompt"], chat=True, system=smollm2.SYSTEM_PROMPT)) <= max_tokens]


def stdlib_records() -> list[dict]:
  """stdlib_prompts in this module's format (kinds prefixed "stdlib_", split by function), less
  those whose signature shows a memory address (`<object object at 0x...>`: not reproducible)."""
  from hamburger_jax.recipes.stdlib_prompts import stdlib_prompts
  return [{"prompt": p["prompt"], "kind": f"stdlib_{p['kind']}", "source": "python",
           "split": p["split"], "item": p["function"]} for p in stdlib_prompts()
          if not re.search(r" at 0x[0-9a-f]+>", p["prompt"])]


def select(broad: list[dict], stdlib: list[dict], num_train: int, num_heldout: int, mix: int,
           rng: random.Random) -> dict[str, list[dict]]:
  """-> {split: prompts in distill order}: `mix` stdlib training prompts (held out: the same
  share), the rest broad prompts with balanced kinds. ValueError when too few exist."""
  out = {}
  for split, n in (("train", num_train), ("heldout", num_heldout)):
    std = [p for p in stdlib if p["split"] == split]
    k = mix if split == "train" else min(len(std), round(mix * num_heldout / num_train))
    have = [p for p in broad if p["split"] == split]
    if k > len(std) or len(have) + k < n:
      raise ValueError(f"only {len(have)} broad and {len(std)} stdlib {split} prompts exist: "
                       f"{n} asked for, {k} of them from the stdlib")
    out[split] = distill_order(balanced(have, n - k, rng) + rng.sample(std, k), rng)
  return out


def answered_prompts(path: str) -> set[str]:
  """The "prompt" of each line of distilled answers (JSONL, gzipped when it ends in .gz)."""
  import gzip
  with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  if not all(isinstance(r, dict) and isinstance(r.get("prompt"), str) for r in rows):
    raise ValueError(f"--exclude_answered: {path} has a line without a \"prompt\" string; pass "
                     "distilled answers (JSONL lines {\"prompt\": ..., \"response\": ...}).")
  return {r["prompt"] for r in rows}


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv=None):
  parser = _Parser(prog="broad_prompts", description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True, help="writes prompts_{train,heldout}.jsonl here")
  parser.add_argument("--num_train", type=int, default=10000)
  parser.add_argument("--num_heldout", type=int, default=300)
  parser.add_argument("--mix_stdlib", type=int, default=0,
                      help="this many of the train prompts come from stdlib_prompts")
  parser.add_argument("--max_prompt_tokens", type=int, default=128,
                      help="drop longer prompts (SmolLM2 ChatML tokens); 0: keep all")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--exclude_answered", default="",
                      help="distilled answers (JSONL[.gz]): leave out the prompts they answer")
  args = parser.parse_args(argv)
  if args.num_train < 1 or args.num_heldout < 0 or args.max_prompt_tokens < 0:
    parser.error(f"--num_train must be >= 1, --num_heldout and --max_prompt_tokens >= 0, got "
                 f"{args.num_train}, {args.num_heldout} and {args.max_prompt_tokens}")
  if not 0 <= args.mix_stdlib <= args.num_train:
    parser.error(f"--mix_stdlib must be in 0..{args.num_train} (--num_train), got "
                 f"{args.mix_stdlib}")
  broad, std = broad_prompts(), stdlib_records() if args.mix_stdlib else []
  try:
    if args.exclude_answered:
      done = answered_prompts(args.exclude_answered)
      broad, std = [p for p in broad if p["prompt"] not in done], [
          p for p in std if p["prompt"] not in done]
    if args.max_prompt_tokens:
      broad, std = fitting(broad, args.max_prompt_tokens), fitting(std, args.max_prompt_tokens)
    out = select(broad, std, args.num_train, args.num_heldout, args.mix_stdlib,
                 random.Random(args.seed))
  except (ValueError, OSError) as e:
    parser.error(str(e))
  os.makedirs(args.workdir, exist_ok=True)
  counts: dict = {}
  for split, chosen in out.items():
    with open(os.path.join(args.workdir, f"prompts_{split}.jsonl"), "w") as f:
      for p in chosen:
        f.write(json.dumps(p) + "\n")
        counts[f"{split}/{p['kind']}"] = counts.get(f"{split}/{p['kind']}", 0) + 1
  print(json.dumps({"workdir": args.workdir, "by_split_kind": dict(sorted(counts.items())),
                    "sources": SOURCES}, indent=1))


if __name__ == "__main__":
  main()
