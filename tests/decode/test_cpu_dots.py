"""Decoding programs compiled with YNNPACK's dot fusions off (`cpu_dots="plain"`,
model/cpu_dots.py): the option reaches the compiler, the LM head takes its multiply-and-sum
form, the answers stay the base's, and a bad mode is refused by name."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hamburger_jax.decode.batching import ContinuousBatcher, Request
from hamburger_jax.decode.checkpoint import check_cpu_dots
from hamburger_jax.decode.prompts import UsageError
from hamburger_jax.decode.sampler import DecodeInputError, Sampler
from hamburger_jax.model import cpu_dots
from hamburger_jax.model.layers import FEW_ROWS, PLAIN_SUM_MAX_ROWS, attend_rows
from tests.decode.helpers import CACHE_LENGTH, OUT_LENGTH, drafting_model

PROMPTS = [[1, 5, 7], [3, 9, 11, 2, 4], [7], [8, 8, 8, 8], [2] * 20, [100, 3], [17] * 9,
           [200, 201, 202]]


@functools.lru_cache(maxsize=None)
def _samplers(mode: str):
  cfg, params = drafting_model()
  kw = dict(cache_length=CACHE_LENGTH, out_length=OUT_LENGTH, cpu_dots=mode)
  return Sampler(cfg, params, base=True, **kw), Sampler(cfg, params, verify=True, **kw)


def _hlo(engine) -> str:
  """The compiled HLO text of a Sampler's or ContinuousBatcher's programs."""
  return "\n".join(c.as_text() for c in engine.executables.compiled.values())


def _ynn_fusions(text: str) -> tuple[int, int]:
  """(YNNPACK fusions, those of them holding a dot) in compiled HLO text."""
  bodies = dict(re.findall(r"^%?([\w.\-]+) \([^\n]*\{\n(.*?)\n\}", text, re.M | re.S))
  called = re.findall(r"calls=%?([\w.\-]+)[^\n]*__ynn_fusion", text)
  assert all(c in bodies for c in called)
  return len(called), sum(" dot(" in bodies[c] for c in called)


@pytest.mark.parametrize("rows", [1, 8])
def test_plain_verified_greedy_is_the_plain_base_token_for_token(rows):
  base, verified = _samplers("plain")
  want = base.decode(PROMPTS[:rows], max_new_tokens=24)
  got = verified.decode(PROMPTS[:rows], max_new_tokens=24, confidence=0.5)
  assert got.tokens == want.tokens and got.finish_reasons == want.finish_reasons
  assert got.stats()["tokens_per_forward"] > 1.3
  # No dot of either sampler's programs runs in a YNNPACK fusion, its reductions do (the LM
  # head's multiply and sum); with "ynnpack" dots do.
  fusions, with_dots = _ynn_fusions(_hlo(base) + _hlo(verified))
  assert fusions > 0 and with_dots == 0
  assert " dot(" in _hlo(base) + _hlo(verified)
  _, default = _samplers("ynnpack")
  default.decode(PROMPTS[:rows], max_new_tokens=24, confidence=0.5)
  assert _ynn_fusions(_hlo(default))[1] > 0


def test_plain_continuous_batching_gives_the_static_answers():
  cfg, params = drafting_model()
  batcher = ContinuousBatcher(cfg, params, verify=True, num_slots=4, cache_length=CACHE_LENGTH,
                              cpu_dots="plain")
  done = batcher.generate([Request(list(p), max_new_tokens=16, confidence=0.5)
                           for p in PROMPTS[:6]])
  base, _ = _samplers("plain")
  want = base.decode(PROMPTS[:6], max_new_tokens=16)
  assert [c.tokens for c in done] == want.tokens
  text = _hlo(batcher)
  assert _ynn_fusions(text)[1] == 0 and " dot(" in text


@pytest.mark.parametrize("rows", [1, 2, 4, 7, 8, 9, PLAIN_SUM_MAX_ROWS, PLAIN_SUM_MAX_ROWS + 1])
def test_attend_rows_takes_the_form_of_its_code_path(rows):
  rng = np.random.default_rng(rows)
  table = jnp.asarray(rng.normal(size=(300, 16)), jnp.float32)
  hidden = jnp.asarray(rng.normal(size=(rows, 16)), jnp.float32)
  want = np.asarray(hidden) @ np.asarray(table).T
  # A fresh jit per form: jit caches a function's trace whatever the context it was traced in.
  with cpu_dots.plain():
    lowered = jax.jit(lambda h, t: attend_rows(h, t)).lower(hidden, table)
  summed = 1 < rows <= PLAIN_SUM_MAX_ROWS
  assert ("dot_general" in lowered.as_text()) == (not summed)
  compiled = lowered.compile(compiler_options=cpu_dots.COMPILER_OPTIONS)
  # The multiply and sum runs as one YNNPACK reduction; no dot runs in YNNPACK.
  assert _ynn_fusions(compiled.as_text()) == ((1, 0) if summed else (0, 0))
  got = compiled(hidden, table)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
  assert got.shape == (rows, 300)
  # Outside `plain()`, the counts in FEW_ROWS take the multiply-and-sum form.
  default = jax.jit(lambda h, t: attend_rows(h, t))
  assert ("dot_general" in default.lower(hidden, table).as_text()) == (rows not in FEW_ROWS)
  np.testing.assert_allclose(np.asarray(default(hidden, table)), want, rtol=1e-5, atol=1e-5)


def test_an_unknown_mode_is_refused_by_name():
  cfg, params = drafting_model()
  with pytest.raises(DecodeInputError, match="cpu_dots must be one of"):
    Sampler(cfg, params, cache_length=CACHE_LENGTH, cpu_dots="eigen")
  with pytest.raises(UsageError, match="--cpu_dots 'eigen' is unknown: use one of ynnpack, plain"):
    check_cpu_dots("eigen")


def test_engines_compile_plain_dots_by_default_on_a_cpu():
  cfg, params = drafting_model()
  sampler = Sampler(cfg, params, verify=True, cache_length=CACHE_LENGTH, out_length=OUT_LENGTH)
  batcher = ContinuousBatcher(cfg, params, base=True, num_slots=2, cache_length=CACHE_LENGTH)
  assert sampler.engine.cpu_dots == batcher.engine.cpu_dots == cpu_dots.DEFAULT == "plain"
  sampler.decode(PROMPTS[:2], max_new_tokens=8, confidence=0.5)
  batcher.generate([Request(list(p), max_new_tokens=8) for p in PROMPTS[:2]])
  text = _hlo(sampler) + _hlo(batcher)
  assert " dot(" in text and _ynn_fusions(text)[1] == 0
