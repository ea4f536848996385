"""Bytes accessed by each op of an optimized XLA TPU program, grouped by what it reads and writes.

    report = attribute(compiled.as_text(), trips={"self_attn/while": 64}, per_step=True)
    report["xla"], report["hbm"]     # bytes per step: XLA's way, and HBM traffic only
    report["groups"]["hbm"]          # {"weights", "kv_cache", "activations", "copies"}: bytes
    report["ops"]                    # one row per executed op: bytes once, times per step, groups

XLA's `cost_analysis()` gives one "bytes accessed" for the whole program, every while-loop body
counted once and a conditional as its costliest branch. This recomputes it op by op from the
optimized HLO the way XLA TPU's cost analysis counts (`xla_once`; within 0.5% of XLA's total on
the 1B decode loops, checked by tests/train/test_hlo_bytes.py): an op reads its operands and
writes its output at their layout-padded sizes (bf16[.., 64] tiled 8 x 128 takes the bytes of
[.., 128]); a fusion reads of a parameter only what its slices and gathers take, one whose root
is a dynamic-update-slice or scatter (or a nested fusion with such a root) writes only the
update (in place); an async copy or slice into or out of on-chip VMEM (`copy-start` /
`slice-start`, memory space S(1): XLA TPU's prefetches and evictions) counts what it moves
twice, once more at its `copy-done` (its `slice-done`: the write); bitcasts (and
`ConcatBitcast`), tuples and parameters move nothing.

XLA's figure counts traffic that never reaches HBM: the VMEM side of each prefetch and the
kernels' reads of the prefetched copy. `hbm` counts only the arrays in HBM (memory space 0):
the corrected figure.

Loop bodies are weighted by their trip count (a counted loop's from its condition,
`hlo_flops._trip_count`; a data-dependent loop's from `trips`, the first key that matches the
loop's op_name, else once); per_step=True reports one iteration of the entry's (first) while
loop: one decode step. Groups, by where each buffer comes from (entry parameters by op_name:
`params...` weights, `...cache...` the KV cache, the rest activations; values keep their source
through loops, tuples and bitcasts): reads of weights and of the KV cache count in those groups
whatever op reads them; ops that only move data (copies, transposes, pads, concatenates,
converts, slices, prefetches: fusions of nothing else) count their writes and other reads in
copies, and what they write is a copy (read again: copies; a copy made in the entry, outside
every loop, keeps its source: a loop reads it as the weight or the cache); an in-place update of
the KV cache counts in kv_cache; everything else in activations.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

from hamburger_jax.train.hlo_flops import _names, _trip_count, parse

GROUPS = ("weights", "kv_cache", "activations", "copies")
_ELEMENT_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                  "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
                  "s4": 0.5, "u4": 0.5, "f8e4m3fn": 1, "f8e5m2": 1}
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\](?:\{([^}]*)\})?")
_MOVES = {"parameter", "constant", "bitcast", "copy", "transpose", "reshape", "broadcast", "slice",
          "dynamic-slice", "dynamic-update-slice", "pad", "concatenate", "convert", "tuple",
          "get-tuple-element", "copy-start", "copy-done", "slice-start", "slice-done", "iota",
          "bitcast-convert"}
_PASS = {"bitcast", "opt-barrier"}   # the output is the operand
_CALLS = re.compile(r"(?:calls|to_apply|body|condition|branch_computations|called_computations)"
                    r"=(\{[^}]*\}|%[\w.\-]+)")
_BITCAST_CALLS = {"ConcatBitcast"}       # TPU: VMEM slices viewed as one buffer, nothing moves


def array_bytes(dtype: str, dims: list[int], layout: str | None) -> float:
  """Bytes of one array buffer, its minor dims padded to the layout's first tile."""
  size = _ELEMENT_BYTES.get(dtype, 4)
  if not dims:
    return size
  order = (layout or "").split(":")[0]
  minor_to_major = [int(d) for d in order.split(",") if d] or list(range(len(dims)))[::-1]
  physical = [dims[d] for d in reversed(minor_to_major)]           # major to minor
  tile = re.search(r"T\(([\d,]+)\)", layout or "")
  if tile:
    t = [int(x) for x in tile.group(1).split(",")]
    for i, ti in enumerate(t[-len(physical):][::-1]):
      physical[-1 - i] = -(-physical[-1 - i] // ti) * ti
  return size * math.prod(physical)


def arrays(shape: str) -> list[tuple[float, bool]]:
  """(bytes, in HBM) of each array of an HLO shape (a tuple's in order)."""
  out = []
  for t, dims, layout in _ARRAY.findall(shape):
    if t in _ELEMENT_BYTES:
      space = re.search(r"S\((\d+)\)", layout or "")
      out.append((array_bytes(t, [int(d) for d in dims.split(",") if d], layout),
                   not space or space.group(1) == "0"))
  return out


def shape_bytes(shape: str, hbm: bool = False) -> float:
  """Bytes of an HLO shape (tuples: the sum); hbm=True: of its arrays in HBM only."""
  return sum(b for b, in_hbm in arrays(shape) if in_hbm or not hbm)


def source(op_name: str) -> str:
  """The group of an entry parameter from its op_name: weights, kv_cache or activations."""
  if op_name.startswith("params"):
    return "weights"
  return "kv_cache" if "cache" in op_name else "activations"


@dataclasses.dataclass
class _Fused:
  reads: dict          # fusion operand -> bytes XLA counts it read
  inplace: dict        # output index -> (operand it updates in place, bytes of the update)
  moves: bool          # only data movement


class _Program:
  """The parsed HLO and per fused computation what it reads and updates in place."""

  def __init__(self, text: str):
    self.comps = parse(text)
    self.entry = next(m.group(1) for m in re.finditer(r"^ENTRY %?([\w.\-]+)", text, re.M))
    self._fused = {}

  def fused(self, comp: str) -> _Fused:
    """What a fused computation reads per parameter, updates in place, and if it only moves."""
    if comp in self._fused:
      return self._fused[comp]
    instrs = self.comps[comp]
    params = {n: int(i[2]) for n, i in instrs.items() if i[1] == "parameter"}
    users = collections.defaultdict(list)
    for n, (_, _, ops, _) in instrs.items():
      for k, o in enumerate(_names(ops)):
        users[o].append((n, k))
    relayouts = {n for n, i in instrs.items() if i[1] == "fusion" and self._relayout(
        _attr(i[3], r"calls=%([\w.\-]+)"))}
    # Nested fusions whose root updates one of their operands in place: (name, operand) -> update.
    nested = {}
    for n, i in instrs.items():
      if i[1] == "fusion":
        for operand, update in self.fused(_attr(i[3], r"calls=%([\w.\-]+)")).inplace.values():
          nested[(n, operand)] = update
    reads = {index: _param_read(instrs, users, p, relayouts, nested)
             for p, index in params.items()}
    root_name, root = list(instrs.items())[-1]
    inplace = {}
    for k, out in enumerate([root_name] if root[1] != "tuple" else _names(root[2])):
      out = _through_bitcasts(instrs, out)
      opcode, ops = instrs[out][1], _names(instrs[out][2])
      updated = [(j, b) for (n, j), b in nested.items() if n == out]
      if opcode in ("dynamic-update-slice", "scatter"):
        updated = [(0, shape_bytes(instrs[ops[-1 if opcode == "scatter" else 1]][0]))]
      elif opcode != "fusion" or len(updated) != 1:
        continue
      target = _through_bitcasts(instrs, ops[updated[0][0]])
      if instrs[target][1] == "parameter":
        inplace[k] = (params[target], updated[0][1])
    moves = all(i[1] in _MOVES or not re.search(r"\[\d", i[0]) for i in instrs.values())
    self._fused[comp] = _Fused(reads, inplace, moves)
    return self._fused[comp]

  def _relayout(self, comp: str) -> bool:
    """Whether a nested fused computation only re-tiles its one parameter (copy / bitcast):
    XLA TPU fuses such a copy into a slice's fusion and moves only what the slice takes."""
    instrs = self.comps.get(comp, {})
    return (sum(i[1] == "parameter" for i in instrs.values()) == 1
            and all(i[1] in ("parameter", "copy", "bitcast") for i in instrs.values()))


def _through_bitcasts(instrs, name):
  while instrs[name][1] == "bitcast":
    name = _names(instrs[name][2])[0]
  return name


def _param_read(instrs, users, name, relayouts=frozenset(), nested=None) -> float:
  """Bytes a fused parameter is read for: what its slices take, else all of it once (through
  bitcasts and `relayouts`, nested fusions that only re-tile it; not what a (nested) update
  writes in place)."""
  total, shared = 0.0, False
  for user, k in users[name]:
    opcode = instrs[user][1]
    if (opcode == "bitcast" or user in relayouts) and users[user]:
      total += _param_read(instrs, users, user, relayouts, nested)
    elif opcode == "slice" or (opcode in ("dynamic-slice", "gather") and k == 0):
      total += shape_bytes(instrs[user][0])
    elif (opcode in ("dynamic-update-slice", "scatter") and k == 0) or (user, k) in (nested or {}):
      continue                                     # updated in place: not read
    elif not shared:
      shared, total = True, total + shape_bytes(instrs[name][0])
  return total


def _element(label, index: int):
  return label[index] if isinstance(label, tuple) else label


def _tuple_arrays(shape: str, index: int) -> list[tuple[float, bool]]:
  """arrays() of element `index` of a tuple shape of arrays (all of them for an array)."""
  found = arrays(shape)
  return [found[index]] if shape.startswith("(") else found


def _attr(attrs: str, pattern: str) -> str:
  m = re.search(pattern, attrs)
  return m.group(1) if m else ""


def _cost(prog: _Program, comp: str, instr):
  """One op -> (reads [(xla, hbm)] per operand, writes [(xla, hbm)], in-place
  {output index: operand}, moves only)."""
  shape, opcode, operands, attrs = instr
  shapes = [prog.comps[comp][o][0] for o in _names(operands)]
  full = lambda s, b=None: (shape_bytes(s) if b is None else b,
                            (shape_bytes(s) if b is None else b) * all(h for _, h in arrays(s)))
  reads, writes = [full(s) for s in shapes], [(b, b * h) for b, h in arrays(shape)]
  inplace, moves = {}, opcode in _MOVES
  if opcode == "fusion":
    fused = prog.fused(_attr(attrs, r"calls=%([\w.\-]+)"))
    reads = [full(s, fused.reads.get(i)) for i, s in enumerate(shapes)]
    for k, (operand, update) in fused.inplace.items():
      writes[k] = (update, update * writes[k][1] / max(writes[k][0], 1))
      inplace[k] = operand
    moves = fused.moves
  elif opcode == "dynamic-slice":
    reads[0] = full(shapes[0], shape_bytes(shape))
  elif opcode == "dynamic-update-slice":
    reads[0], update = (0.0, 0.0), shape_bytes(shapes[1])
    writes, inplace = [(update, update * writes[0][1] / max(writes[0][0], 1))], {0: 0}
  elif opcode in ("slice-start", "copy-start"):     # (destination, source, context)
    (dst, dst_hbm), = _tuple_arrays(shape, 1 if opcode == "slice-start" else 0)
    reads = [(dst, dst * (reads[0][1] > 0))]
    writes = [(dst, dst * dst_hbm)]
  elif opcode in ("slice-done", "copy-done"):       # XLA counts the move again; nothing moves
    out = shape_bytes(shape)
    reads, writes = [(out if opcode == "copy-done" else 0.0, 0.0)], [(out, 0.0)]
  elif _attr(attrs, r'custom_call_target="([^"]*)"') in _BITCAST_CALLS:
    reads, writes, moves = [(0.0, 0.0)] * len(shapes), [], True
  return reads, writes, inplace, moves


def _groups(reads, writes, labels, kv_write: bool, moves: bool, view: int) -> dict:
  """The op's bytes (view 0: XLA's, 1: HBM) by group; see the module docstring."""
  groups = dict.fromkeys(GROUPS, 0.0)
  rest = "copies" if moves else "activations"
  for r, label in zip(reads, labels):
    group = {"weights": "weights", "kv_cache": "kv_cache", "copy": "copies"}.get(label, rest)
    groups["kv_cache" if kv_write else group] += r[view]
  groups["kv_cache" if kv_write else rest] += sum(w[view] for w in writes)
  return groups


class _Walk:
  """Walks the scheduled computations from the entry: rows of executed ops, labels of values."""

  def __init__(self, prog: _Program, trips: dict[str, int], classify):
    self.prog, self.trips, self.classify = prog, trips, classify
    self.loops = []

  def computation(self, comp: str, labels_in, weight: float):
    """-> (rows, XLA's bytes with loops once, label of the root)."""
    labels, rows, once = {}, [], 0.0
    for name, instr in self.prog.comps[comp].items():
      shape, opcode, operands, attrs = instr
      op_labels = [labels.get(o, "activations") for o in _names(operands)]
      if opcode == "parameter":
        labels[name] = (labels_in[int(operands)] if labels_in is not None else
                        self.classify(_attr(attrs, r'op_name="([^"]*)"')))
      elif opcode == "get-tuple-element":
        labels[name] = _element(op_labels[0], int(_attr(attrs, r"index=(\d+)")))
      elif opcode == "tuple":
        labels[name] = tuple(op_labels)
      elif opcode in _PASS:
        labels[name] = op_labels[0]
      elif opcode in ("while", "conditional", "call"):
        sub_rows, sub_once, labels[name] = self.control(comp, name, instr, op_labels, weight)
        rows, once = rows + sub_rows, once + sub_once
      elif opcode != "constant":
        row, labels[name] = self.op(comp, name, instr, op_labels)
        row["count"] = weight
        rows.append(row)
        once += row["xla"]
    root = list(self.prog.comps[comp])[-1]
    return rows, once, labels.get(root, "activations")

  def control(self, comp, name, instr, op_labels, weight):
    """A while loop (body x trips), conditional (costliest branch) or call."""
    attrs = instr[3]
    if instr[1] == "while":
      trips, rows, once = self.loop_trips(comp, name, instr), [], 0.0
      for sub in (_attr(attrs, r"condition=%([\w.\-]+)"), _attr(attrs, r"body=%([\w.\-]+)")):
        r, o, _ = self.computation(sub, [op_labels[0]], weight * trips)
        rows, once = rows + r, once + o
      return rows, once, op_labels[0]
    callees = [_names(g) for g in _CALLS.findall(attrs)][0]
    if instr[1] == "conditional":
      branches = [self.computation(b, [op_labels[1 + i]], weight) for i, b in enumerate(callees)]
      cost = [sum(r["xla"] * r["count"] for r in rows) for rows, _, _ in branches]
      rows, _, label = branches[cost.index(max(cost))]
      return rows, max(o for _, o, _ in branches), label
    return self.computation(callees[0], op_labels, weight)

  def loop_trips(self, comp, name, instr) -> int:
    """Trips of a counted loop, else the first `trips` key found in its op_name, else 1."""
    trips = _trip_count(self.prog.comps, comp, instr[2], instr[3])
    op_name = _attr(instr[3], r'op_name="([^"]*)"')
    if trips is None:
      trips = next((t for key, t in self.trips.items() if re.search(key, op_name)), 1)
    self.loops.append({"name": name, "op_name": op_name, "trips": trips})
    return trips

  def op(self, comp, name, instr, op_labels):
    """One executed op -> (its row: bytes and their groups, the label of its output)."""
    shape, opcode, operands, attrs = instr
    reads, writes, inplace, moves = _cost(self.prog, comp, instr)
    kv_write = any(op_labels[o] == "kv_cache" for o in inplace.values())
    shapes = [self.prog.comps[comp][o][0] for o in _names(operands)]
    big = {_element(op_labels[i], 0) for i, s in enumerate(shapes) if re.search(r"\[\d", s)}
    if inplace:                                    # the updated buffer keeps its source
      label = (tuple(op_labels[inplace[k]] if k in inplace else "activations"
                     for k in range(len(writes))) if shape.startswith("(") else
               op_labels[inplace[0]])
    elif not moves or not big & {"weights", "kv_cache", "copy"}:
      label = "activations"
    else:                                          # a copy; made outside the loops: the source
      label = "copy" if comp != self.prog.entry or len(big) > 1 else big.pop()
    groups = [_groups(reads, writes, op_labels, kv_write, moves, v) for v in (0, 1)]
    row = {"name": name, "opcode": opcode, "op_name": _attr(attrs, r'op_name="([^"]*)"'),
           "computation": comp, "shape": re.sub(r"\{[^}]*\}", "", shape),
           "xla": sum(r[0] for r in reads) + sum(w[0] for w in writes),
           "hbm": sum(r[1] for r in reads) + sum(w[1] for w in writes),
           "groups": {"xla": groups[0], "hbm": groups[1]}}
    return row, label


def attribute(text: str, trips: dict[str, int] | None = None, per_step: bool = False,
              classify=source) -> dict:
  """Bytes accessed per op of an optimized HLO module (see the module docstring).

  trips: {op_name regex: trips} for data-dependent loops. per_step: one iteration of the entry's
  first while loop (body and condition), else one run of the program.
  -> {"xla_once", "xla", "hbm", "groups": {"xla": {group: bytes}, "hbm": {..}}, "ops", "loops"}.
  """
  prog = _Program(text)
  walk = _Walk(prog, trips or {}, classify)
  rows, once, _ = walk.computation(prog.entry, None, 1.0)
  if per_step:
    whiles = [n for n, i in prog.comps[prog.entry].items() if i[1] == "while"]
    loop = next(r for r in walk.loops if r["name"] in whiles)
    steps = _reachable(prog, prog.comps[prog.entry][loop["name"]])
    rows = [dict(r, count=r["count"] / loop["trips"]) for r in rows if r["computation"] in steps]
  total = lambda key: sum(r[key] * r["count"] for r in rows)
  groups = {v: {g: sum(r["groups"][v][g] * r["count"] for r in rows) for g in GROUPS}
            for v in ("xla", "hbm")}
  return {"xla_once": once, "xla": total("xla"), "hbm": total("hbm"), "groups": groups,
          "ops": sorted(rows, key=lambda r: -r["xla"] * r["count"]), "loops": walk.loops}


def _reachable(prog: _Program, instr) -> set[str]:
  """The computations a while loop runs (its body, condition and the loops / branches in them)."""
  todo, seen = [_attr(instr[3], rf"{k}=%([\w.\-]+)") for k in ("condition", "body")], set()
  while todo:
    comp = todo.pop()
    if comp not in seen:
      seen.add(comp)
      todo += [c for i in prog.comps[comp].values() if i[1] in ("while", "conditional", "call")
               for g in _CALLS.findall(i[3]) for c in _names(g)]
  return seen
