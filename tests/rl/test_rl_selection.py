"""The pure selection path (rl.selection.select_rollouts) with and without jit, roc's random
mode, and selection of user-registered pieces by name."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.rl import advantages, registry, roc, selection

REWARDS = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0], [1, 0, 0, 0]], np.float32)


class SelectionTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_filters_zero_variance_and_keeps_g(self):
    pen = np.zeros_like(REWARDS)
    for mode in ("paper", "released", "random"):
      fn = self.variant(
        functools.partial(selection.select_rollouts, group_size=2, mode=mode, min_pos=1, min_neg=1)
      )
      out = fn(jax.random.key(0), REWARDS, pen)
      idx, keep = np.asarray(out.indices), np.asarray(out.keep_group)
      assert keep.tolist() == [False, False, True, True]
      assert idx.shape == (4, 2) and idx.dtype == np.int32
      np.testing.assert_array_equal(np.asarray(out.keep), np.repeat(keep[:, None], 2, 1))
      np.testing.assert_array_equal(np.asarray(out.rewards), np.take_along_axis(REWARDS, idx, 1))
      np.testing.assert_array_equal(np.asarray(out.advantages)[:2], 0.0)
      for g in (2, 3):
        assert len(set(idx[g])) == 2
        if mode != "random":  # RoC keeps min 1 of each side; random is uniform
          sel = REWARDS[g, idx[g]]
          assert sel.max() == 1 and sel.min() == 0
    out = self.variant(
      functools.partial(
        selection.select_rollouts, group_size=2, min_pos=1, min_neg=1, drop_zero_variance=False
      )
    )(jax.random.key(0), REWARDS, pen)
    assert np.asarray(out.keep_group).all()

  @chex.variants(with_jit=True, without_jit=True)
  def test_advantages_are_grpo_on_the_kept_rollouts(self):
    sel = np.array([[1, 0, 1, 0], [1, 1, 1, 1]], np.float32)
    out = self.variant(functools.partial(selection.select_rollouts, group_size=4, adv_eps=1e-6))(
      jax.random.key(0), sel, np.zeros_like(sel)
    )
    adv = np.asarray(out.advantages)
    np.testing.assert_allclose(adv[1], 0.0)
    std = np.std([1, 0, 1, 0], ddof=1)
    np.testing.assert_allclose(adv[0], (sel[0] - 0.5) / (std + 1e-6), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(out.indices), np.tile(np.arange(4), (2, 1)))

  @chex.variants(with_jit=True, without_jit=True)
  def test_paper_mode_prefers_low_penalty(self):
    rewards = np.array([[1, 1, 1, 1, 0, 0, 0, 0]], np.float32)
    pen = np.array([[1.5, 0.0, 1.5, 0.0, 0, 0, 0, 0]], np.float32)
    fn = self.variant(functools.partial(selection.select_rollouts, group_size=4))
    for seed in range(5):
      idx = np.asarray(fn(jax.random.key(seed), rewards, pen).indices)
      assert set(idx[0]) & {0, 1, 2, 3} == {1, 3}

  @chex.variants(with_jit=True, without_jit=True)
  def test_random_mode_is_uniform_not_penalty_driven(self):
    rewards = np.array([[1, 1, 1, 1, 0, 0, 0, 0]], np.float32)
    pen = np.array([[1.5, 0.0, 1.5, 0.0, 0, 0, 0, 0]], np.float32)
    fn = self.variant(functools.partial(roc.roc_downsample, group_size=4, mode="random"))
    picked = [set(np.asarray(fn(jax.random.key(s), rewards, pen))[0].tolist()) for s in range(40)]
    assert all(len(p) == 4 for p in picked)
    assert sum(len(p & {0, 2}) for p in picked) > 10  # high-penalty ones too
    assert len({tuple(sorted(p)) for p in picked}) > 5  # varies with the key


def test_jit_wrapper_matches_eager():
  pen = np.random.default_rng(0).uniform(0, 1, REWARDS.shape).astype(np.float32)
  kw = dict(group_size=2, mode="paper", min_pos=1, min_neg=1, neg_adv_scale=0.5)
  a = selection.select_rollouts(jax.random.key(3), REWARDS, pen, **kw)
  b = selection.select_rollouts_jit(jax.random.key(3), REWARDS, pen, **kw)
  for x, y in zip(a, b):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)


def test_user_registered_pieces_are_selected_by_name():
  calls = []

  @registry.register("downsample", "test_first_g")
  def first_g(key, rewards, penalties, *, group_size, **unused):
    calls.append("downsample")
    return jnp.broadcast_to(jnp.arange(group_size, dtype=jnp.int32), (rewards.shape[0], group_size))

  @registry.register("advantage", "test_raw_reward")
  def raw(selected_rewards, eps=1e-6, unbiased_std=True, valid=None):
    calls.append("advantage")
    return selected_rewards * valid

  out = selection.select_rollouts(
    jax.random.key(0),
    REWARDS,
    np.zeros_like(REWARDS),
    group_size=2,
    mode="test_first_g",
    advantage="test_raw_reward",
  )
  assert calls == ["downsample", "advantage"]
  np.testing.assert_array_equal(np.asarray(out.indices), np.tile([0, 1], (4, 1)))
  np.testing.assert_array_equal(np.asarray(out.advantages), [[0, 0], [0, 0], [1, 0], [1, 0]])


def test_registry_reregistration_rules():
  def f(x):
    return x

  registry.register("test_kind", "f")(f)

  def f(x):  # noqa: F811  (same module + qualname: a re-import / autoreload)
    return x + 1

  assert registry.register("test_kind", "f")(f) is f
  assert registry.get("test_kind", "f") is f

  def other(x):
    return x

  with pytest.raises(ValueError, match="already registered"):
    registry.register("test_kind", "f")(other)
  registry.register("test_kind", "f", override=True)(other)
  assert registry.get("test_kind", "f") is other
  with pytest.raises(KeyError, match=r"no test_kind named 'g'; known: \['f'\]"):
    registry.get("test_kind", "g")
  assert advantages.grpo_advantages is registry.get("advantage", "grpo")
  assert registry.names("downsample")[:3] == ["paper", "released", "random"]
