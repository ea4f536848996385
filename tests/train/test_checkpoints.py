"""Orbax checkpoints: round trip of state + config + data state, keep K, partial saves ignored."""

import jax
import jax.numpy as jnp
import numpy as np

from hamburger_jax.train import checkpoints


def _state(x):
  return {"params": {"w": jnp.full((4, 3), x, jnp.float32)}, "step": jnp.int32(x)}


def test_round_trip_and_keep(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path), save_every=1, keep=2)
  for step in (1, 2, 3):
    ckpt.save(step, _state(step), {"seed": 0, "rules": [["embed", None]]}, {"batches": step * 10},
              force=True)
  ckpt.wait()
  assert ckpt.all_steps() == [2, 3] and ckpt.latest_step() == 3
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = checkpoints.abstract_with_shardings(
      jax.eval_shape(lambda: _state(0)), jax.tree.map(lambda _: sharding, _state(0)))
  state, data = ckpt.restore(3, abstract)
  np.testing.assert_array_equal(state["params"]["w"], np.full((4, 3), 3.0))
  assert int(state["step"]) == 3 and data == {"batches": 30}
  assert ckpt.saved_config(3) == {"seed": 0, "rules": [["embed", None]]}
  ckpt.close()


def test_unfinished_save_is_ignored_and_cleaned(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path), save_every=1, keep=3)
  ckpt.save(1, _state(1), {}, {"batches": 1}, force=True)
  ckpt.close()
  partial = tmp_path / "2.orbax-checkpoint-tmp"       # what a killed save leaves behind
  (partial / "state").mkdir(parents=True)
  (partial / "state" / "garbage").write_bytes(b"\x00" * 10)
  again = checkpoints.Checkpointer(str(tmp_path), save_every=1, keep=3)
  assert again.latest_step() == 1
  again.save(2, _state(2), {}, {"batches": 2}, force=True)   # a save waits for the clean-up
  again.close()
  assert again.all_steps() == [1, 2]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"]


def test_data_state_is_frozen_at_save_time():
  live = {"batches": 1}
  snap = checkpoints.DataState(live)
  live["batches"] = 2
  assert snap.get_state() == b'{"batches": 1}'
  restored = checkpoints.DataState()
  restored.set_state(b'{"parent": {"next_index": 7}}')
  assert restored.state == {"parent": {"next_index": 7}}
