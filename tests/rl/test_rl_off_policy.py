"""TIS and AReaL's decoupled PPO against a NumPy reference; both reduce to policy_loss when
the behaviour policy is the proximal one."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.rl import losses, off_policy, registry

N, T = 4, 6


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  logp = rng.normal(-1.0, 0.4, (N, T)).astype(np.float32)
  prox = (logp + rng.normal(0, 0.3, (N, T))).astype(np.float32)
  behav = (prox + rng.normal(0, 0.8, (N, T))).astype(np.float32)  # some rho > 2, some < 1
  adv = np.array([1.0, -1.0, 0.5, -2.0], np.float32)
  mask = (rng.uniform(size=(N, T)) < 0.7).astype(np.float32)
  mask[:, 0] = 1.0
  return logp, prox, behav, adv, mask


def _np_loss(logp, prox, behav, adv, mask, mode, cap, el=0.2, eh=0.28, c=None):
  """Value and d(loss)/d(logp) by hand."""
  a = adv[:, None]
  r = np.exp(logp - prox)
  rho = np.exp(prox - behav)
  if mode == "truncate":
    w = np.minimum(rho, cap)
  else:
    w = np.where(rho > cap, 0.0, rho) if cap is not None else rho
  un, cl = -a * r, -a * np.clip(r, 1 - el, 1 + eh)
  per = np.maximum(un, cl)
  g = np.where(un >= cl, -a * r, 0.0)
  if c is not None:
    capped = (a < 0) & (per > -a * c)
    per = np.where(capped, -a * c, per)
    g = np.where(capped, 0.0, g)
  n = mask.sum()
  return (w * per * mask).sum() / n, w * g * mask / n


CASES = [
  ("tis", "truncate", dict(cap=2.0), 2.0),
  ("decoupled_ppo", "mask", dict(cap=2.0), 2.0),
  ("decoupled_ppo", "mask", dict(cap=None), None),
]


class OffPolicyLossTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_value_and_grad_match_numpy(self):
    logp, prox, behav, adv, mask = _inputs()
    for name, mode, kw, cap in CASES:
      for c in (None, 3.0):
        fn = registry.get("off_policy_loss", name)
        f = self.variant(
          lambda lp, name=name, kw=kw, c=c: registry.get("off_policy_loss", name)(
            lp, prox, behav, adv, mask, dual_clip_c=c, **kw
          )[0]
        )
        val, grad = jax.value_and_grad(f)(jnp.asarray(logp))
        want, want_g = _np_loss(logp, prox, behav, adv, mask, mode, cap, c=c)
        np.testing.assert_allclose(val, want, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(grad, want_g, rtol=1e-5, atol=1e-6, err_msg=name)
        assert fn is getattr(
          off_policy, {"tis": "tis_policy_loss", "decoupled_ppo": "decoupled_policy_loss"}[name]
        )

  @chex.variants(with_jit=True, without_jit=True)
  def test_reduces_exactly_to_policy_loss_when_behaviour_is_proximal(self):
    logp, prox, _, adv, mask = _inputs(1)
    base = self.variant(lambda lp: losses.policy_loss(lp, prox, adv, mask, dual_clip_c=3.0)[0])
    v0, g0 = jax.value_and_grad(base)(jnp.asarray(logp))
    for name, _, kw, _ in CASES:
      f = self.variant(
        lambda lp, name=name, kw=kw: registry.get("off_policy_loss", name)(
          lp, prox, prox, adv, mask, dual_clip_c=3.0, **kw
        )[0]
      )
      v, g = jax.value_and_grad(f)(jnp.asarray(logp))
      np.testing.assert_array_equal(np.asarray(v), np.asarray(v0))  # bit for bit
      np.testing.assert_array_equal(np.asarray(g), np.asarray(g0))

  @chex.variants(with_jit=True, without_jit=True)
  def test_weights_and_metrics_analytic(self):
    prox = jnp.log(jnp.array([[0.5, 0.5, 0.5, 0.5]]))
    behav = jnp.log(jnp.array([[0.5, 0.1, 0.4, 0.9]]))  # rho = 1, 5, 1.25, 0.555..
    mask = jnp.array([[1.0, 1.0, 1.0, 0.0]])
    f = self.variant(functools.partial(off_policy.behaviour_weights, cap=2.0, mode="truncate"))
    w, m = f(prox, behav, mask)
    np.testing.assert_allclose(w, [[1.0, 2.0, 1.25, 0.0]], rtol=1e-6)
    red = losses.reduce_metrics(m)
    np.testing.assert_allclose(red["is_weight_mean"], (1 + 2 + 1.25) / 3, rtol=1e-6)
    np.testing.assert_allclose(red["is_capped_frac"], 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(red["is_ratio_mean"], (1 + 5 + 1.25) / 3, rtol=1e-5)
    g = self.variant(functools.partial(off_policy.behaviour_weights, cap=2.0, mode="mask"))
    w2, _ = g(prox, behav, mask)
    np.testing.assert_allclose(w2, [[1.0, 0.0, 1.25, 0.0]], rtol=1e-6)

  def test_metrics_include_weights_and_errors(self):
    logp, prox, behav, adv, mask = _inputs()
    _, m = off_policy.tis_policy_loss(jnp.asarray(logp), prox, behav, adv, mask)
    assert {"loss", "clip_frac", "is_weight_mean", "is_capped_frac", "behav_kl"} <= set(m)
    with pytest.raises(ValueError, match="TIS cap must be a number >= 1"):
      off_policy.tis_policy_loss(logp, prox, behav, adv, mask, cap=0.5)
    with pytest.raises(ValueError, match="mode must be one of"):
      off_policy.behaviour_weights(prox, behav, mask, cap=2.0, mode="clip")
    with pytest.raises(ValueError, match="share a shape"):
      off_policy.behaviour_weights(prox, behav[:, :2], mask, cap=2.0)
    assert sorted(registry.names("off_policy_loss")) == ["decoupled_ppo", "tis"]
    assert "tis" not in registry.names("policy_loss")
