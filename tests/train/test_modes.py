"""Plain base-LM training, then HAMburger fine-tuning from its export with the base frozen."""

import jax
import numpy as np
import pytest

from configs import base_lm_tiny, tiny
from hamburger_jax.train.loop import train_and_evaluate
from hamburger_jax.train.run_config import model_config
from hamburger_jax.train.setup import Setup
from hamburger_jax.convert import load_hf_llama, load_model
from hamburger_jax.train.metrics_writer import read_jsonl


def _config(module, **overrides):
  c = module.get_config()
  c.logging.progress_bar = False
  c.logging.tensorboard = False
  c.update_from_flattened_dict(overrides)
  return c


@pytest.mark.slow
def test_base_lm_then_frozen_base_finetune(tmp_path):
  base_dir = tmp_path / "base_lm"
  c = _config(base_lm_tiny, **{"num_train_steps": 30, "eval.every_steps": 30,
                               "checkpoint.every_steps": 30})
  state = train_and_evaluate(c, str(base_dir))
  assert set(state.params) == {"base"}
  rows = read_jsonl(str(base_dir))
  losses = [r["train/loss"] for r in rows if "train/loss" in r]
  assert losses[-1] < 0.8 * losses[0], losses
  (ev,) = [r for r in rows if "eval/loss" in r]
  assert np.isclose(ev["eval/perplexity"], np.exp(ev["eval/loss"]), rtol=1e-5)

  export = str(base_dir / "export")
  kind, _, _ = load_model(export)
  assert kind == "llama"
  _, base_params = load_hf_llama(export)

  c2 = _config(tiny, **{"num_train_steps": 6, "freeze_base": True, "init.checkpoint": export,
                        "eval.every_steps": 0, "checkpoint.every_steps": 3})
  tuned = train_and_evaluate(c2, str(tmp_path / "tuned"))
  flat_tuned = jax.tree_util.tree_leaves_with_path(jax.device_get(tuned.params["base"]))
  flat_base = dict(jax.tree_util.tree_leaves_with_path(base_params))
  assert len(flat_tuned) == len(flat_base)
  for path, value in flat_tuned:
    expected = flat_base[path]
    assert value.dtype == expected.dtype
    assert value.tobytes() == np.asarray(expected).tobytes(), jax.tree_util.keystr(path)

  # The grafted modules did train, and the optimizer holds no state for the frozen base.
  fresh = Setup(c2, model_config(c2), tuned.params["base"]["norm"]["scale"]
                          .sharding.mesh).init_state()
  moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(tuned.params["micro_decoder"]),
                                                   jax.tree.leaves(fresh.params["micro_decoder"]))]
  assert all(moved)
  grafted = sum(x.size for k in ("embedder", "micro_decoder")
                for x in jax.tree.leaves(tuned.params[k]))
  opt_sizes = sum(x.size for x in jax.tree.leaves(tuned.opt_state) if x.ndim)
  assert opt_sizes == 2 * grafted        # Adam mu + nu of the grafted params only
