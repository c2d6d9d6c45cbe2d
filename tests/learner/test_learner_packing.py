"""Packed rows: first-fit-decreasing packing, and packed == unpacked losses and gradients.

Tolerances (float32): losses and metrics rtol 1e-5 / atol 1e-6; gradients (one SGD step at lr 1,
so new params = params - grads) atol 2e-6. Packing only moves tokens between rows; the sums run
in a different order.
"""

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rstar_jax.learner import packing, steps
from rstar_jax.learner.batch import make_rl_batch, make_sft_batch, rl_inputs
from rstar_jax.learner.train_state import TrainState
from rstar_jax.models import qwen3
from rstar_jax.sharding import make_mesh


@dataclasses.dataclass
class Traj:
  prompt_ids: list
  response_ids: list
  loss_mask: list
  logprobs: list


def test_first_fit_decreasing():
  bins = packing.first_fit_decreasing([5, 9, 3, 7, 2, 0, 4], capacity=10)
  assert bins == [[1], [3, 2], [0, 6], [4]]  # 9 | 7+3 | 5+4 | 2 (item 5 is empty: dropped)
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, 50, 200)
  bins = packing.first_fit_decreasing(lengths, 64)
  assert sorted(i for b in bins for i in b) == list(range(200))
  assert all(sum(lengths[i] for i in b) <= 64 for b in bins)
  assert len(bins) <= np.ceil(11 / 9 * lengths.sum() / 64) + 1
  with pytest.raises(ValueError, match="item of length 11 > capacity 10"):
    packing.first_fit_decreasing([11], 10)


def _trajs(seed=0, n=9, t=24, vocab=97):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    p = int(rng.integers(1, 6))
    r = int(rng.integers(1, t - p + 1))
    mask = (rng.random(r) < 0.8).astype(int).tolist()
    out.append(
      Traj(
        rng.integers(1, vocab, p).tolist(),
        rng.integers(1, vocab, r).tolist(),
        mask,
        (np.log(1 / vocab) + rng.normal(size=r) * 0.3).tolist(),
      )
    )
  adv = rng.normal(size=n).astype(np.float32)
  return out, adv


def test_pack_batch_layout():
  t0 = Traj([5, 6], [10, 11, 12], [1, 0, 1], [-0.1, -9.0, -0.3])  # 5 tokens
  t1 = Traj([8], [13], [1], [-0.5])  # 2 tokens
  t2 = Traj([7, 7, 7], [14, 15, 16, 17], [1, 1, 1, 1], [-1.0] * 4)  # 7 tokens
  b = make_rl_batch([t0, t1, t2], [1.5, -0.5, 2.0], pad_to=8, pad_id=3)
  p = packing.pack_batch(b, pad_id=3, row_multiple=4)
  assert p["input_ids"].shape == (4, 8) and p["advantages"].shape == (4, 8)
  # FFD: t2 (7) alone, then t0 (5) + t1 (2).
  np.testing.assert_array_equal(p["input_ids"][0], [7, 7, 7, 14, 15, 16, 17, 3])
  np.testing.assert_array_equal(p["input_ids"][1], [5, 6, 10, 11, 12, 8, 13, 3])
  np.testing.assert_array_equal(p["segment_ids"][1], [1, 1, 1, 1, 1, 2, 2, 0])
  np.testing.assert_array_equal(p["positions"][1], [0, 1, 2, 3, 4, 0, 1, 0])
  np.testing.assert_array_equal(p["loss_mask"][1], [0, 0, 1, 0, 1, 0, 1, 0])
  np.testing.assert_allclose(p["sampler_logprobs"][1], [0, 0, -0.1, 0, -0.3, 0, -0.5, 0])
  np.testing.assert_allclose(p["advantages"][1], [1.5] * 5 + [-0.5] * 2 + [0])
  assert p["attention_mask"][2:].sum() == 0
  assert packing.pad_fraction(b) == pytest.approx(1 - 14 / 24)
  assert packing.pad_fraction(p) == pytest.approx(1 - 14 / 32)  # 4 rows after row_multiple
  with pytest.raises(ValueError, match="already packed"):
    packing.pack_batch(p)
  left = dict(b, attention_mask=b["attention_mask"][:, ::-1].copy())
  with pytest.raises(ValueError, match="right-padded"):
    packing.pack_batch(left)


CFG = qwen3.Qwen3Config(
  vocab_size=97,
  hidden_size=32,
  intermediate_size=48,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=8,
)


@functools.cache
def _params():
  return qwen3.init_params(CFG, jax.random.key(3))


def _step(kind, cfg, batch):
  apply_fn = lambda p, ids, m, **kw: qwen3.forward(p, cfg, ids, attention_mask=m, **kw)
  fn = steps.rl_step if kind == "rl" else steps.sft_step
  state = TrainState.create(jax.tree.map(jnp.copy, _params()), optax.sgd(1.0), 0)
  new, metrics = jax.jit(
    functools.partial(fn, apply_fn=apply_fn, config=steps.StepConfig(num_micro_batches=1))
  )(state, {k: jnp.asarray(v) for k, v in batch.items()})
  return jax.device_get(new.params), jax.device_get(metrics)


def _batches(kind):
  trajs, adv = _trajs()
  if kind == "rl":
    b = rl_inputs(make_rl_batch(trajs, adv, pad_to=24), steps.RL_KEYS)
  else:
    b = make_sft_batch(
      [(t.prompt_ids + t.response_ids, [0] * len(t.prompt_ids) + t.loss_mask) for t in trajs],
      pad_to=24,
    )
  return b, packing.pack_batch(b)


@pytest.mark.parametrize("kind", ["rl", "sft"])
@pytest.mark.parametrize("attention", ["xla", "blockwise"])
def test_packed_equals_unpacked_loss_and_grads(kind, attention):
  unpacked, packed = _batches(kind)
  assert packed["input_ids"].shape[0] < unpacked["input_ids"].shape[0]
  cfg = CFG.replace(attention=attention, attention_block_size=8)
  p_u, m_u = _step(kind, CFG, unpacked)  # reference: unpacked, "xla"
  p_p, m_p = _step(kind, cfg, packed)
  chex.assert_trees_all_close(m_p, m_u, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(p_p, p_u, atol=2e-6, rtol=0)
  assert float(m_u["num_tokens"]) > 0 and float(m_u["grad_norm"]) > 0


def test_packed_rows_refuse_per_row_aggregation():
  _, packed = _batches("rl")
  apply_fn = lambda p, ids, m, **kw: qwen3.forward(p, CFG, ids, attention_mask=m, **kw)
  state = TrainState.create(_params(), optax.sgd(1.0), 0)
  with pytest.raises(ValueError, match="not per trajectory on packed rows"):
    steps.rl_step(
      state,
      {k: jnp.asarray(v) for k, v in packed.items()},
      apply_fn=apply_fn,
      config=steps.StepConfig(agg="seq-mean-token-mean"),
    )


@pytest.mark.slow
def test_sharded_packed_step_and_logprobs_equal_unpacked():
  """8 fake devices, blockwise attention, 2 micro-batches: the packed RL update and the
  recomputed log-probs equal the unpacked ones."""
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  cfg = CFG.replace(attention="blockwise", attention_block_size=8)
  unpacked, _ = _batches("rl")
  unpacked = {
    k: np.concatenate([v, np.zeros((16 - v.shape[0],) + v.shape[1:], v.dtype)])
    for k, v in unpacked.items()
  }
  packed = packing.pack_batch(unpacked, row_multiple=8)
  out = {}
  for name, b in (("unpacked", unpacked), ("packed", packed)):
    tx = optax.sgd(1.0)
    js = steps.make_jitted_steps(cfg, mesh, tx=tx, config=steps.StepConfig(num_micro_batches=2))
    sharded = js.shard_batch(b)
    lp = np.asarray(js.compute_logprobs(_params(), sharded)) * b["loss_mask"]
    state = js.shard_state(TrainState.create(jax.tree.map(jnp.copy, _params()), tx, 0))
    state, metrics = js.rl_step(state, sharded)
    out[name] = (jax.device_get(state.params), jax.device_get(metrics), lp)
  chex.assert_trees_all_close(out["packed"][0], out["unpacked"][0], atol=2e-6, rtol=0)
  chex.assert_trees_all_close(out["packed"][1], out["unpacked"][1], rtol=1e-5, atol=1e-6)
  # Same multiset of per-token log-probs on loss tokens (rows were rearranged).
  np.testing.assert_allclose(
    np.sort(out["packed"][2][packed["loss_mask"] > 0]),
    np.sort(out["unpacked"][2][unpacked["loss_mask"] > 0]),
    rtol=1e-5,
    atol=1e-5,
  )


def test_pack_for_step_rounds_rows_and_reports_padding():
  trajs, adv = _trajs(n=9)
  b = make_rl_batch(trajs, adv, pad_to=24, row_multiple=16)  # 16 rows, 9 real
  packed, m = packing.pack_for_step(b, row_multiple=2)
  rows = packed["input_ids"].shape[0]
  assert rows in (2, 4, 8, 16) and rows <= 16
  assert m["batch/rows_packed"] == rows
  assert m["batch/pad_fraction_packed"] < m["batch/pad_fraction_unpacked"]
  assert m["batch/pad_fraction_unpacked"] == pytest.approx(packing.pad_fraction(b))
  assert packed["attention_mask"].sum() == b["attention_mask"].sum()
  assert packed["loss_mask"].sum() == b["loss_mask"].sum()
