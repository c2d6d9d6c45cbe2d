"""GRPO advantages: analytic values, zero mean, unit std, degenerate groups."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rstar_jax.rl import advantages, registry


class AdvantagesTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_analytic_unbiased(self):
    r = jnp.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    adv = np.asarray(self.variant(advantages.grpo_advantages)(r))
    a = 0.5 / (np.sqrt(1.0 / 3.0) + 1e-6)
    np.testing.assert_allclose(adv[0], [a, -a, -a, a], rtol=1e-6)
    np.testing.assert_array_equal(adv[1], 0.0)  # constant group -> zeros
    np.testing.assert_allclose(adv.mean(-1), 0.0, atol=1e-6)
    np.testing.assert_allclose(adv[[0, 2]].std(-1, ddof=1), 1.0, rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_biased_and_unnormalised(self):
    r = jnp.array([[2.0, 0.0, 1.0, 3.0]])
    adv = self.variant(functools.partial(advantages.grpo_advantages, unbiased_std=False))(r)
    np.testing.assert_allclose(np.asarray(adv).std(-1), 1.0, rtol=1e-5)
    raw = self.variant(functools.partial(advantages.grpo_advantages, normalize_by_std=False))(r)
    np.testing.assert_allclose(raw, [[0.5, -1.5, -0.5, 1.5]])

  @chex.variants(with_jit=True, without_jit=True)
  def test_valid_mask_and_single(self):
    r = jnp.array([[1.0, 0.0, 7.0, 7.0], [1.0, 5.0, 5.0, 5.0]])
    valid = jnp.array([[True, True, False, False], [True, False, False, False]])
    adv = np.asarray(self.variant(advantages.grpo_advantages)(r, valid=valid))
    a = 0.5 / (np.sqrt(0.5) + 1e-6)
    np.testing.assert_allclose(adv[0], [a, -a, 0.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(adv[1], [1.0 / (1.0 + 1e-6), 0, 0, 0], rtol=1e-6)

  def test_registered(self):
    self.assertIs(registry.get("advantage", "grpo"), advantages.grpo_advantages)


class ScaleNegativeTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_only_negative_entries_scale(self):
    adv = jnp.array([[1.5, -0.5, 0.0, -1.0], [-2.0, 2.0, 0.25, -0.25]])
    out = np.asarray(self.variant(advantages.scale_negative_advantages)(adv, 0.1))
    np.testing.assert_allclose(out, [[1.5, -0.05, 0.0, -0.1], [-0.2, 2.0, 0.25, -0.025]], rtol=1e-6)
    np.testing.assert_array_equal(self.variant(advantages.scale_negative_advantages)(adv, 1.0), adv)
    # A traced scale (e.g. a schedule inside a jitted step) works too.
    traced = self.variant(lambda a, s: advantages.scale_negative_advantages(a, s))(
      adv, jnp.float32(0.0)
    )
    np.testing.assert_array_equal(np.asarray(traced) < 0, False)

  def test_registered_and_used_by_the_selection_path(self):
    from rstar_jax.rl import selection

    assert (
      registry.get("advantage_transform", "scale_negative") is advantages.scale_negative_advantages
    )
    r = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
    sel = lambda s: np.asarray(
      selection.select_rollouts(
        jax.random.key(0), r, np.zeros_like(r), group_size=4, adv_eps=1e-6, neg_adv_scale=s
      ).advantages
    )
    plain, scaled = sel(1.0), sel(0.25)
    np.testing.assert_allclose(scaled[0], np.where(plain[0] < 0, 0.25 * plain[0], plain[0]))
    np.testing.assert_array_equal(scaled[1], 0.0)
