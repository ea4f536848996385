"""Matmul FLOPs of an optimized XLA program with every while loop weighted by its trip count.

    count = matmul_flops(compiled.as_text())   # {"flops", "flops_once", "loops": [trips, ..]}

XLA's cost analysis counts a while-loop body once, so scanned layers, loss chunks and gradient
accumulation are under-counted by their trip counts. This walks the optimized HLO instead: each
`dot` (2 x output elements x contracted size) and `convolution` (XLA TPU writes matmuls as
convolutions: counted like XLA's HloCostAnalysis, `_conv_flops`) counts once
per execution, i.e. times the trip counts of the loops around it (`compare(counter, N), LT` of the
loop condition, minus a constant start). Splash attention kernels (Pallas custom calls, opaque to
XLA) count as the matmuls they do, at the causal half like `model_flops`: forward 2 (QK^T, PV),
dq 3, dkv 4 matmuls of 2 x B x heads x T_q x T_k x head_dim / 2 each. Elementwise work is left
out: this is the number to compare with 6 x params x tokens + attention. FLOPs are per chip (the
program is the SPMD-partitioned one). A loop whose condition is not a counter (a data-dependent
`while_loop`) counts once; its entry in "loops" is None.
"""

from __future__ import annotations

import math
import re

import numpy as np

_COMP = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$")
_SPLASH_MATMULS = {"splash_mha_fwd": 2, "splash_mha_dq": 3, "splash_mha_dkv": 4}


def _dims(shape: str) -> list[int]:
  m = re.match(r"\w+\[([\d,]*)\]", shape)
  return [int(d) for d in m.group(1).split(",") if d] if m else []


def _split(rest: str):
  """'shape opcode(operands), attrs' -> (shape, opcode, operands text, attrs)."""
  if rest.startswith("("):                     # tuple shape: up to its closing parenthesis
    depth = 0
    for i, ch in enumerate(rest):
      depth += {"(": 1, ")": -1}.get(ch, 0)
      if depth == 0:
        break
    shape, rest = rest[:i + 1], rest[i + 2:]
  else:
    shape, _, rest = rest.partition(" ")
  opcode, _, rest = rest.partition("(")
  operands, _, attrs = rest.partition(")")
  return shape, opcode, operands, attrs


def parse(text: str) -> dict[str, dict[str, tuple]]:
  """HLO text -> {computation: {instruction: (shape, opcode, operands text, attrs)}} (in order)."""
  comps, cur = {}, None
  for line in text.splitlines():
    m = _COMP.match(line)
    if m:
      cur = comps.setdefault(m.group(1), {})
      continue
    m = _INSTR.match(line)
    if m and cur is not None:
      cur[m.group(1)] = _split(m.group(2))
  return comps


def _names(operands: str) -> list[str]:
  return re.findall(r"%([\w.\-]+)", operands)


def _instr_flops(name: str, instr, shapes: dict) -> float:
  shape, opcode, operands, attrs = instr
  out, ops = math.prod(_dims(shape)), _names(operands)
  if opcode == "dot":
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attrs)
    lhs = _dims(shapes[ops[0]])
    idx = [int(d) for d in contracting.group(1).split(",") if d] if contracting else []
    return 2.0 * out * math.prod(lhs[i] for i in idx)
  if opcode == "convolution":
    return _conv_flops(_dims(shapes[ops[0]]), _dims(shapes[ops[1]]), _dims(shape), attrs)
  kind = next((k for k in _SPLASH_MATMULS if name.startswith(k)), None)
  if opcode == "custom-call" and kind:
    qk = [d for d in (_dims(shapes[o]) for o in ops) if len(d) == 4][:2]
    if len(qk) == 2:
      (b, heads, tq, h), tk = qk[0], qk[1][2]
      return _SPLASH_MATMULS[kind] * 2.0 * b * heads * tq * tk * h / 2
  return 0.0


def _window(attrs: str, key: str, rank: int, default: int) -> list[list[int]]:
  m = re.search(rf"\b{key}=([\dx_]+)", attrs)
  if not m:
    return [[default]] * rank
  return [[int(v) for v in d.split("_")] for d in m.group(1).split("x")]


def _conv_flops(lhs, rhs, out, attrs: str) -> float:
  """XLA's count (HloCostAnalysis): 2 x in features / groups x out features x batch / batch
  groups x, per spatial dim, the (output, kernel) position pairs that hit real input elements
  (TPU writes batched matmuls as convolutions with dilated, padded windows)."""
  lhs_l, rhs_l, out_l = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", attrs).groups()
  rank = len(lhs_l) - 2
  size, stride = _window(attrs, "size", rank, 1), _window(attrs, "stride", rank, 1)
  pad, lhs_dil = _window(attrs, "pad", rank, 0), _window(attrs, "lhs_dilate", rank, 1)
  rhs_dil = _window(attrs, "rhs_dilate", rank, 1)
  pairs = 1
  for d in range(rank):
    k = np.arange(size[d][0])[:, None]
    o = np.arange(out[out_l.index(str(d))])[None, :]
    u = o * stride[d][0] - pad[d][0] + k * rhs_dil[d][0]
    real = (u % lhs_dil[d][0] == 0) & (u >= 0) & (u // lhs_dil[d][0] < lhs[lhs_l.index(str(d))])
    pairs *= int(real.sum())
  groups = re.search(r"feature_group_count=(\d+)", attrs)
  batch_groups = re.search(r"batch_group_count=(\d+)", attrs)
  fma = (lhs[lhs_l.index("f")] // (int(groups.group(1)) if groups else 1) * rhs[rhs_l.index("o")]
         * lhs[lhs_l.index("b")] // (int(batch_groups.group(1)) if batch_groups else 1) * pairs)
  return 2.0 * fma


def _int_constant(instrs, name: str) -> int | None:
  """The integer value of `name` if it is a constant (through copies / bitcasts), else None."""
  for _ in range(8):
    shape, opcode, operands, _ = instrs.get(name, ("", "", "", ""))
    if opcode == "constant":
      return int(operands) if re.fullmatch(r"-?\d+", operands) else None
    if opcode not in ("copy", "bitcast", "copy-done", "copy-start") or not _names(operands):
      return None
    name = _names(operands)[0]
  return None


def _trip_count(comps, caller: str, operands: str, attrs: str) -> int | None:
  """Trips of a while loop `i < N` with i += k in the body and a constant start (else None)."""
  cond = comps[re.search(r"condition=%([\w.\-]+)", attrs).group(1)]
  body = comps[re.search(r"body=%([\w.\-]+)", attrs).group(1)]
  for shape, opcode, ops, at in cond.values():
    if opcode != "compare" or "direction=LT" not in at:
      continue
    counter, limit = (cond.get(n) for n in _names(ops))
    limit = _int_constant(cond, _names(ops)[-1])
    index = re.search(r"index=(\d+)", counter[3]) if counter and counter[1] == "get-tuple-element" \
        else None
    if limit is None or index is None:
      return None
    i = int(index.group(1))
    step = body.get(_names(list(body.values())[-1][2])[i])         # body root tuple element i
    if not step or step[1] != "add":
      return None
    k = next((c for c in (_int_constant(body, n) for n in _names(step[2])) if c), None)
    init = comps[caller].get(_names(operands)[0])
    start = (_int_constant(comps[caller], _names(init[2])[i]) if init and init[1] == "tuple"
             else None)
    if not k or start is None:
      return None
    return max(-(-(limit - start) // k), 0)
  return None


def matmul_flops(text: str) -> dict:
  """Per-chip matmul FLOPs of one run of the program (see the module docstring)."""
  comps = parse(text)
  entry = next(m.group(1) for m in re.finditer(r"^ENTRY %?([\w.\-]+)", text, re.M))
  memo, loops = {}, []

  def flops(comp: str, weighted: bool) -> float:
    if (comp, weighted) in memo:
      return memo[comp, weighted]
    instrs = comps[comp]
    shapes = {n: i[0] for n, i in instrs.items()}
    total = 0.0
    for name, instr in instrs.items():
      total += _instr_flops(name, instr, shapes)
      attrs = instr[3]
      trips = 1
      if instr[1] == "while":
        trips = _trip_count(comps, comp, instr[2], attrs)
        if weighted:
          loops.append(trips)
        trips = 1 if trips is None else trips
      for group in re.findall(r"(?:calls|to_apply|body|branch_computations|called_computations)"
                              r"=(\{[^}]*\}|%[\w.\-]+)", attrs):
        callee_names = _names(group)
        total += sum(flops(c, weighted) for c in callee_names) * (trips if weighted else 1)
    memo[comp, weighted] = total
    return total

  return {"flops": flops(entry, True), "flops_once": flops(entry, False), "loops": loops}
