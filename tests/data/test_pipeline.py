"""The grain pipeline: packing invariants, static shapes, sharding, epochs, resume with orbax."""

import collections

import grain
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamburger_jax.model.batch import BATCH_FIELDS
from hamburger_jax.data.pipeline import (PipelineConfig, batch_spec, fit_example, make_dataset,
                                         make_iterator, restore_iterator, save_iterator)


def _records(examples):
  return [{"tokens": e.tokens, "prompt_length": e.prompt_length, "steps": e.steps}
          for e in examples]


def _key(tokens, prompt_length, steps):
  return (tuple(int(t) for t in tokens), int(prompt_length), tuple(int(s) for s in steps))


def _unpack(batch):
  """Every packed example of a batch as a (tokens, prompt length, steps) key; checks invariants.

  Within a segment: the prompt sits at positions 0..T-1 (one token each); the target at macro
  position j is the input at j + 1 (teacher forcing) and positions advance by its size.
  """
  out = []
  for r in range(batch["segment_ids"].shape[0]):
    seg = batch["segment_ids"][r]
    used = np.flatnonzero(seg)
    assert used.size == 0 or used.tolist() == list(range(used.size)), "padding inside a row"
    for f in BATCH_FIELDS:                                 # padding is all zeros
      assert not batch[f][r, used.size:].any(), f
    ids = seg[used]
    assert ids.tolist() == sorted(ids.tolist()) and (ids.size == 0 or ids[0] == 1)
    assert set(np.diff(ids).tolist()) <= {0, 1}            # contiguous segments 1, 2, ..
    for k in np.unique(ids):
      sl = used[ids == k]
      g_tok, g_len = batch["group_tokens"][r, sl], batch["group_lengths"][r, sl]
      t_tok, t_len = batch["target_tokens"][r, sl], batch["target_lengths"][r, sl]
      pos = batch["positions"][r, sl]
      t = int(np.flatnonzero(t_len)[0]) + 1                # first predicting position is T - 1
      assert (t_len[t - 1:] > 0).all() and (t_len[:t - 1] == 0).all()
      assert (g_len[:t] == 1).all() and pos[:t].tolist() == list(range(t))
      assert (g_tok[:t, 1:] == 0).all()
      for j in range(t - 1, len(sl) - 1):                  # targets aligned with next inputs
        assert g_len[j + 1] == t_len[j] and (g_tok[j + 1] == t_tok[j]).all()
        assert pos[j + 1] == pos[j] + t_len[j]
      for j in range(len(sl)):                             # nothing beyond a group's size
        assert not g_tok[j, g_len[j]:].any() and not t_tok[j, t_len[j]:].any()
      response = [int(x) for j in range(t - 1, len(sl)) for x in t_tok[j, :t_len[j]]]
      out.append(_key(g_tok[:t, 0].tolist() + response, t, t_len[t - 1:]))
  return out


def _all(it):
  return [b for b in it]


def test_batches_are_static_and_cover_the_dataset(prepared):
  data_dir, name, examples = prepared
  cfg = PipelineConfig(data_dir, name, seq_len=24, num_rows=3, max_steps=4, seed=3)
  batches = _all(make_iterator(cfg, process_index=0, process_count=1))
  spec = batch_spec(cfg)
  for b in batches:
    assert sorted(b) == sorted(BATCH_FIELDS)
    for k, v in b.items():
      assert v.shape == spec[k] and v.dtype == np.int32, k
  got = [k for b in batches for k in _unpack(b)]
  assert collections.Counter(got) == collections.Counter(_key(*e) for e in examples)
  assert got != [_key(*e) for e in examples]               # shuffled
  ds = make_dataset(cfg, process_index=0, process_count=1)
  again = _all(iter(ds))
  assert all((a[k] == b[k]).all() for a, b in zip(batches, again) for k in BATCH_FIELDS)
  assert ds.stats.examples == 40 and ds.stats.batches == len(again) and 0.5 < ds.stats.fill <= 1


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 25), seq_len=st.integers(2, 30), num_rows=st.integers(1, 4),
       max_steps=st.integers(1, 4), seed=st.integers(0, 2**16), overlong=st.sampled_from(
           ["truncate", "drop"]))
def test_packing_invariants(helpers, n, seq_len, num_rows, max_steps, seed, overlong):
  examples = helpers.random_examples(n, seed=seed, max_prompt=8, max_response=14,
                                     max_steps=max_steps)
  cfg = PipelineConfig("", "", seq_len=seq_len, num_rows=num_rows, max_steps=max_steps,
                       seed=seed, overlong=overlong, read_threads=1)
  ds = make_dataset(cfg, source=_records(examples), process_index=0, process_count=1)
  batches = _all(iter(ds))
  got = [k for b in batches for k in _unpack(b)]
  for b in batches:
    assert {k: v.shape for k, v in b.items()} == batch_spec(cfg)
    assert b["segment_ids"][:, 0].any()                    # no empty batch
  expected = []
  for e in examples:
    fitted = fit_example(e.tokens, e.prompt_length, e.steps, seq_len, overlong)
    if fitted is not None:
      expected.append(_key(np.concatenate(fitted[:2]), len(fitted[0]), fitted[2]))
  assert collections.Counter(got) == collections.Counter(expected)   # none lost or duplicated
  assert ds.stats.dropped == n - len(expected)


def test_fit_example_rules():
  tokens = np.arange(10, dtype=np.int32)                   # prompt 3, response 7 in 3 groups
  steps = np.array([3, 2, 2], np.int32)
  assert fit_example(tokens, 3, steps, 5, "truncate")[2].tolist() == [3, 2, 2]   # 3 + 3 - 1
  p, r, s = fit_example(tokens, 3, steps, 4, "truncate")
  assert p.tolist() == [0, 1, 2] and r.tolist() == [3, 4, 5, 6, 7] and s.tolist() == [3, 2]
  assert fit_example(tokens, 3, steps, 4, "drop") is None
  assert fit_example(tokens, 3, steps, 2, "truncate") is None   # the prompt alone is too long


def test_two_hosts_see_disjoint_examples_covering_the_dataset(prepared):
  data_dir, name, examples = prepared
  everything = collections.Counter(_key(*e) for e in examples)
  for even, hosts in ((False, 3), (True, 3), (False, 2)):
    seen = []
    for index in range(hosts):
      cfg = PipelineConfig(data_dir, name, seq_len=32, num_rows=2, even_shards=even)
      seen.append(collections.Counter(
          k for b in make_iterator(cfg, process_index=index, process_count=hosts)
          for k in _unpack(b)))
    for i in range(hosts):
      for j in range(i + 1, hosts):
        assert not seen[i] & seen[j]
    union = sum(seen, collections.Counter())
    if even:
      assert {sum(c.values()) for c in seen} == {len(examples) // hosts}
      assert union <= everything and sum(union.values()) == 39
    else:
      assert union == everything
  with pytest.raises(ValueError, match="outside"):
    make_iterator(PipelineConfig(data_dir, name), process_index=2, process_count=2)


def test_epochs_reshuffle_and_seeds(prepared):
  data_dir, name, examples = prepared
  cfg = PipelineConfig(data_dir, name, seq_len=32, num_rows=2, num_epochs=2, seed=5)
  got = [k for b in make_iterator(cfg, process_index=0, process_count=1) for k in _unpack(b)]
  assert collections.Counter(got) == collections.Counter(
      {_key(*e): 2 for e in examples})
  first, second = got[:40], got[40:]
  assert sorted(first) == sorted(second) and first != second
  other = PipelineConfig(data_dir, name, seq_len=32, num_rows=2, num_epochs=2, seed=6)
  assert [k for b in make_iterator(other, process_index=0, process_count=1)
          for k in _unpack(b)] != got
  forever = make_iterator(PipelineConfig(data_dir, name, seq_len=32, num_rows=2,
                                         num_epochs=None), process_index=0, process_count=1)
  assert sum(len(_unpack(next(forever))) for _ in range(60)) > 80   # past two epochs


def test_wrong_max_steps_is_reported(prepared):
  data_dir, name, _ = prepared
  with pytest.raises(ValueError, match="max_steps"):
    next(make_iterator(PipelineConfig(data_dir, name, max_steps=2), process_index=0,
                       process_count=1))


@pytest.mark.parametrize("stop_after", [1, 3, 7])
def test_resume_gives_the_batches_of_an_uninterrupted_run(prepared, tmp_path, stop_after):
  data_dir, name, _ = prepared
  cfg = PipelineConfig(data_dir, name, seq_len=20, num_rows=2, num_epochs=2, seed=11)
  reference = _all(make_iterator(cfg, process_index=0, process_count=1))
  assert len(reference) > stop_after + 3
  it = make_iterator(cfg, process_index=0, process_count=1)
  for _ in range(stop_after):
    next(it)
  save_iterator(it, str(tmp_path / "ckpt"))
  fresh = restore_iterator(make_iterator(cfg, process_index=0, process_count=1),
                           str(tmp_path / "ckpt"))
  rest = _all(fresh)
  assert len(rest) == len(reference) - stop_after
  for a, b in zip(rest, reference[stop_after:]):
    for k in BATCH_FIELDS:
      np.testing.assert_array_equal(a[k], b[k])
  # The original iterator continues identically too.
  np.testing.assert_array_equal(next(it)["group_tokens"], reference[stop_after]["group_tokens"])


def test_resume_through_a_checkpoint_manager(prepared, tmp_path):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  data_dir, name, _ = prepared
  cfg = PipelineConfig(data_dir, name, seq_len=20, num_rows=2, num_epochs=None, seed=2)
  it = make_iterator(cfg, process_index=0, process_count=1)
  for _ in range(4):
    next(it)
  with ocp.CheckpointManager(str(tmp_path / "run")) as mngr:
    mngr.save(4, args=ocp.args.Composite(step=ocp.args.JsonSave({"step": 4}),
                                         data=grain.checkpoint.CheckpointSave(it)))
    mngr.wait_until_finished()
  expected = [next(it) for _ in range(3)]
  with ocp.CheckpointManager(str(tmp_path / "run")) as mngr:
    fresh = make_iterator(cfg, process_index=0, process_count=1)
    restored = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(
        step=ocp.args.JsonRestore(), data=grain.checkpoint.CheckpointRestore(fresh)))
  assert restored.step == {"step": 4}
  for want in expected:
    got = next(restored.data)
    assert all((got[k] == want[k]).all() for k in BATCH_FIELDS)
