"""RL / SFT batch building from trajectories (token-aligned target convention)."""

import dataclasses

import numpy as np
import pytest

from rstar_jax.learner.batch import make_rl_batch, make_sft_batch, split_rl_batch


@dataclasses.dataclass
class Traj:
  prompt_ids: list
  response_ids: list
  loss_mask: list
  logprobs: list


def test_rl_batch_layout():
  # response: 2 generated tokens, 2 tool tokens (mask 0), 1 generated token.
  t0 = Traj([5, 6, 7], [10, 11, 90, 91, 12], [1, 1, 0, 0, 1], [-0.1, -0.2, -9.0, -9.0, -0.3])
  t1 = Traj([8], [13], [1], [-0.5])
  b = make_rl_batch([t0, t1], [1.5, -0.5], pad_to=10, pad_id=3, row_multiple=4)
  assert b["input_ids"].shape == (4, 10) and b["advantages"].shape == (4,)
  assert b["input_ids"].dtype == np.int32 and b["loss_mask"].dtype == np.float32
  np.testing.assert_array_equal(b["input_ids"][0], [5, 6, 7, 10, 11, 90, 91, 12, 3, 3])
  np.testing.assert_array_equal(b["attention_mask"][0], [1] * 8 + [0] * 2)
  np.testing.assert_array_equal(b["loss_mask"][0], [0, 0, 0, 1, 1, 0, 0, 1, 0, 0])
  # Logprobs sit on the column of the token they score; tool-token logprobs are zeroed.
  np.testing.assert_allclose(b["sampler_logprobs"][0], [0, 0, 0, -0.1, -0.2, 0, 0, -0.3, 0, 0])
  np.testing.assert_array_equal(b["input_ids"][1, :2], [8, 13])
  np.testing.assert_array_equal(b["loss_mask"][1], [0, 1] + [0] * 8)
  np.testing.assert_allclose(b["advantages"], [1.5, -0.5, 0, 0])
  # Rows added for row_multiple are empty.
  assert b["attention_mask"][2:].sum() == 0 and b["loss_mask"][2:].sum() == 0


@pytest.mark.parametrize(
  "traj,adv,match",
  [
    (Traj([1], [2, 3], [1], [0.0, 0.0]), [0.0], "one entry per response token"),
    (Traj([1], [2, 3], [1, 1], [0.0]), [0.0], "one entry per response token"),
    (Traj([], [2], [1], [0.0]), [0.0], "empty prompt_ids"),
    (Traj([1] * 5, [2] * 6, [1] * 6, [0.0] * 6), [0.0], "11 tokens > pad_to=10"),
    (Traj([1], [2], [2], [0.0]), [0.0], "only 0/1"),
    (Traj([1], [2], [1], [0.0]), [0.0, 1.0], "advantages must have shape"),
    (Traj([1], [2], [1], [0.0]), [float("nan")], "not finite"),
  ],
)
def test_rl_batch_errors_name_problem(traj, adv, match):
  with pytest.raises(ValueError, match=match):
    make_rl_batch([traj], adv, pad_to=10)


def test_sft_batch():
  b = make_sft_batch([([1, 2, 3, 4], [1, 0, 1, 1]), ([7, 8], [0, 1])], pad_to=6, row_multiple=3)
  np.testing.assert_array_equal(b["input_ids"][0], [1, 2, 3, 4, 0, 0])
  # Column 0 is never a target (nothing predicts it).
  np.testing.assert_array_equal(b["loss_mask"][0], [0, 0, 1, 1, 0, 0])
  np.testing.assert_array_equal(b["loss_mask"][1], [0, 1, 0, 0, 0, 0])
  assert b["input_ids"].shape == (3, 6) and b["attention_mask"][2].sum() == 0
  with pytest.raises(ValueError, match="sequence 0: loss_mask has 1 entries, ids has 2"):
    make_sft_batch([([1, 2], [1])], pad_to=6)


def test_rl_batch_from_rollout_trajectory():
  from rstar_jax.rollout.types import TRAJECTORY_FINISH_REASONS, Trajectory

  tr = Trajectory(
    prompt_ids=[1, 2],
    response_ids=[3, 4, 5],
    loss_mask=[1, 0, 1],
    logprobs=[-0.25, 0.0, -0.75],
    weight_versions=[4, 4, 4],
    num_turns=2,
    tool_calls=[],
    finish_reason=TRAJECTORY_FINISH_REASONS[0],
  )
  b = make_rl_batch([tr], [2.0], pad_to=6)
  np.testing.assert_array_equal(b["input_ids"][0], [1, 2, 3, 4, 5, 0])
  np.testing.assert_array_equal(b["loss_mask"][0], [0, 0, 1, 0, 1, 0])
  np.testing.assert_allclose(b["sampler_logprobs"][0], [0, 0, -0.25, 0, -0.75, 0])


def _seven_row_batch():
  trajs = [Traj([1 + i], [10 + i] * (i + 1), [1] * (i + 1), [-0.1 * i] * (i + 1)) for i in range(7)]
  return make_rl_batch(trajs, [float(i) for i in range(7)], pad_to=12, pad_id=3, row_multiple=10)


def test_split_rl_batch_partitions_real_rows_into_fixed_shapes():
  b = _seven_row_batch()
  mbs = split_rl_batch(b, 3, np.random.default_rng(0), rows=4, pad_id=3)
  assert len(mbs) == 3
  for mb in mbs:
    assert set(mb) == set(b)
    assert all(mb[k].shape == (4,) + b[k].shape[1:] and mb[k].dtype == b[k].dtype for k in b)
  # Every real row lands in exactly one mini-batch, intact (advantage identifies the row).
  got = []
  for mb in mbs:
    real = mb["attention_mask"].any(axis=1)
    assert 2 <= real.sum() <= 3
    for r in np.flatnonzero(real):
      i = int(mb["advantages"][r])
      got.append(i)
      for k in b:
        np.testing.assert_array_equal(mb[k][r], b[k][i])
    # Padding rows: no tokens, no loss, no advantage, the pad id.
    pad = ~real
    assert mb["loss_mask"][pad].sum() == 0 and mb["advantages"][pad].sum() == 0
    assert (mb["input_ids"][pad] == 3).all()
  assert sorted(got) == list(range(7))
  # The shuffle follows the rng: same seed, same split; another seed, another order.
  again = split_rl_batch(b, 3, np.random.default_rng(0), rows=4, pad_id=3)
  assert all((x["advantages"] == y["advantages"]).all() for x, y in zip(mbs, again))
  other = split_rl_batch(b, 3, np.random.default_rng(1), rows=4, pad_id=3)
  assert any((x["advantages"] != y["advantages"]).any() for x, y in zip(mbs, other))


def test_split_rl_batch_edge_cases():
  b = _seven_row_batch()
  assert split_rl_batch(b, 1, np.random.default_rng(0))[0] is b
  # Default rows = ceil(N / M) over all N rows (here 10 / 2).
  assert split_rl_batch(b, 2, np.random.default_rng(0))[0]["input_ids"].shape == (5, 12)
  # Fewer real rows than mini-batches: only non-empty mini-batches come back.
  few = make_rl_batch([Traj([1], [2], [1], [0.0])] * 2, [1.0, -1.0], pad_to=4, row_multiple=8)
  assert len(split_rl_batch(few, 4, np.random.default_rng(0), rows=2)) == 2
  with pytest.raises(ValueError, match="need 3 rows each, got rows=2"):
    split_rl_batch(b, 3, np.random.default_rng(0), rows=2)
  with pytest.raises(ValueError, match="num_mini_batches"):
    split_rl_batch(b, 0, np.random.default_rng(0))


def _contract_batch():
  t0 = Traj([5, 6, 7], [10, 11, 90, 12], [1, 1, 0, 1], [-0.1, -0.2, -9.0, -0.3])
  t1 = Traj([8], [13], [1], [-0.5])
  return make_rl_batch([t0, t1], [1.5, -0.5], pad_to=8, pad_id=3)


def test_step_inputs_builds_the_keys_the_step_reads():
  from rstar_jax.learner import steps

  b = _contract_batch()
  proximal = np.full(b["loss_mask"].shape, -0.4, np.float32)
  on, m_on = steps.step_inputs(b, steps.StepConfig(), proximal)
  assert set(on) == set(steps.StepConfig().rl_keys) and "sampler_logprobs" not in on
  np.testing.assert_allclose(on["old_logprobs"], -0.4 * b["loss_mask"])  # learner's, masked
  assert set(m_on) == {"sampler_logprob_drift"} and m_on["sampler_logprob_drift"] > 0

  tis = steps.StepConfig(tis_cap=2.0)
  off, m_off = steps.step_inputs(b, tis, proximal, older_weights=True)
  assert set(off) == set(tis.rl_keys) and "behaviour_logprobs" in off
  np.testing.assert_array_equal(off["behaviour_logprobs"], b["sampler_logprobs"])
  # Importance ratios against the learner's log-probs; the cap comes from the StepConfig.
  lm = b["loss_mask"] > 0
  r = np.exp(-0.4 - b["sampler_logprobs"][lm].astype(np.float64))
  assert m_off["async/is_ratio_max"] == pytest.approx(r.max(), rel=1e-6)
  assert m_off["async/is_truncated_frac"] == pytest.approx((r > 2.0).mean())

  # Not recomputed: the sampler's log-probs are the old ones, and there is nothing to compare.
  same, m_none = steps.step_inputs(b, steps.StepConfig(), None, older_weights=True)
  np.testing.assert_array_equal(same["old_logprobs"], b["sampler_logprobs"])
  assert m_none == {}
  with pytest.raises(ValueError, match="proximal log-probs expected shape"):
    steps.step_inputs(b, steps.StepConfig(), proximal[:, :3])
