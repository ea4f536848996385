"""The HAMburger model reproduces the original PyTorch implementation's teacher-forced outputs.

Fixture: tests/fixtures/official_tiny (weights in the original Lightning layout and the original's
outputs on one packed row of 3 sequences). Tolerance: max|port - golden| / max|golden| <= 1e-4.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.fixture_paths import OFFICIAL_TINY
from hamburger_jax.model.batch import make_batch
from hamburger_jax.convert import load_original
from hamburger_jax.train.losses import hamburger_loss
from hamburger_jax.model.hamburger import HamburgerModel

GOLDEN = np.load(os.path.join(OFFICIAL_TINY, "golden_forward.npz"))
CONFIG = os.path.join(OFFICIAL_TINY, "config.json")


def rel_err(a, ref):
  return float(np.abs(np.asarray(a, np.float64) - ref).max() / np.abs(ref).max())


def golden_examples():
  g = GOLDEN
  seqs = np.split(g["input_ids"], np.cumsum(g["seq_lens"])[:-1])
  steps = np.split(g["steps_flat"], np.cumsum(g["steps_counts"])[:-1])
  return [(s[:t], s[t:], st) for s, t, st in zip(seqs, g["inst_lens"], steps)]


@pytest.fixture(scope="module", params=["tiny_official.ckpt", "tiny_official.safetensors"])
def forward(request):
  if request.param.endswith(".ckpt"):
    pytest.importorskip("torch")
  cfg, params = load_original(os.path.join(OFFICIAL_TINY, request.param), CONFIG)
  batch = make_batch(golden_examples(), cfg.max_steps, seq_len=40)
  out = HamburgerModel(cfg).apply({"params": params}, jax.tree_util.tree_map(jnp.asarray, batch))
  return cfg, batch, out


@pytest.mark.slow
def test_logits_and_stops(forward):
  _, batch, out = forward
  keep = np.arange(4) < batch["target_lengths"][..., None]     # [B, M, S]: rows in golden order
  logits = np.asarray(out.logits)[keep]
  stops = np.asarray(out.stop_logits)[keep]
  assert logits.shape == GOLDEN["logits"].shape
  assert rel_err(logits, GOLDEN["logits"]) <= 1e-4
  assert rel_err(stops, GOLDEN["stops"][:, 0]) <= 1e-4
  np.testing.assert_array_equal(logits.argmax(-1), GOLDEN["logits"].argmax(-1))
  np.testing.assert_array_equal(np.asarray(batch["target_tokens"])[keep], GOLDEN["label_targets"])


def test_intermediates(forward):
  _, batch, out = forward
  g = GOLDEN
  # The original also feeds each sequence's last group (whose output predicts nothing); this port
  # does not, so compare every merged input except those.
  ends = np.cumsum(g["comp_seq_lens"]) - 1
  golden_rows = np.setdiff1d(np.arange(len(g["comp_position_ids"])), ends)
  real = batch["segment_ids"][0] > 0
  assert rel_err(np.asarray(out.embeddings)[0][real], g["comp_token_embeds"][golden_rows]) <= 1e-4
  np.testing.assert_array_equal(batch["positions"][0][real], g["comp_position_ids"][golden_rows])
  has_target = batch["target_lengths"][0] > 0
  assert rel_err(np.asarray(out.features)[0][has_target], g["features"]) <= 1e-4
  steps = g["steps_flat"]
  keep = np.arange(4)[None] < steps[:, None]
  micro = np.asarray(out.micro_outputs)[0][has_target]
  assert rel_err(micro[keep], g["micro_step_outputs"][keep]) <= 1e-4


def test_losses(forward):
  _, batch, out = forward
  loss, metrics = hamburger_loss(out.logits, out.stop_logits, batch["target_tokens"],
                                 batch["target_lengths"])
  for name, key in (("loss", "loss"), ("label_loss", "label_loss"), ("stop_loss", "stop_loss")):
    value = loss if name == "loss" else metrics[name]
    assert abs(float(value) - float(GOLDEN[key])) <= 1e-4 * abs(float(GOLDEN[key])), name
  assert float(metrics["tokens"]) == 42
