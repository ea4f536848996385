"""The SmolLM2 recipe's training record (what the shipped manifest says about its weights)."""

import json
import os

from hamburger_jax.recipes import smollm2


def test_training_record(tmp_path):
  assert smollm2.training_record(str(tmp_path)) == {}          # nothing trained yet
  meta = tmp_path / "data" / "hamburger_sft" / "smollm2_sft" / "1.0.0"
  meta.mkdir(parents=True)
  seg = {"strategy": "decreasing_v2", "min_value": 1.0, "ratio": 0.5}
  (meta / "metadata.json").write_text(json.dumps({
      "stats": {"examples": 3, "response_tokens": 30, "tokens_per_group": 1.5, "groups": 20},
      "settings": {"segmentation": seg}}))
  for step in (25, 200):
    cfg_dir = tmp_path / "train" / "checkpoints" / str(step) / "config"
    cfg_dir.mkdir(parents=True)
    (cfg_dir / "metadata").write_text(json.dumps({
        "init": {"checkpoint": f"ckpt{step}"}, "freeze_base": True,
        "model": {"num_micro_layers": 2}, "data": {"batch_size": 8, "seq_len": 256}}))
  os.makedirs(tmp_path / "train" / "checkpoints" / "200.orbax-checkpoint-tmp-1")
  record = smollm2.training_record(str(tmp_path))
  assert record == {"data": {"examples": 3, "response_tokens": 30, "tokens_per_group": 1.5,
                             "segmentation": seg},
                    "train_steps": 200, "init_checkpoint": "ckpt200", "freeze_base": True,
                    "num_micro_layers": 2, "batch_size": 8, "seq_len": 256}
