"""Policy and SFT losses against NumPy references; masking; exact micro-batch token-mean."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.rl import losses, registry

N, T, V = 4, 6, 7


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  logp = rng.normal(-1.0, 0.4, (N, T)).astype(np.float32)
  old = (logp + rng.normal(0, 0.3, (N, T))).astype(np.float32)  # ratios inside and outside clip
  adv = np.array([1.0, -1.0, 0.5, -2.0], np.float32)
  mask = (rng.uniform(size=(N, T)) < 0.7).astype(np.float32)
  mask[:, 0] = 1.0
  ref = (logp + rng.normal(0, 0.2, (N, T))).astype(np.float32)
  ent = rng.uniform(0.5, 2.0, (N, T)).astype(np.float32)
  return logp, old, adv, mask, ref, ent


def _np_policy(
  logp, old, adv, mask, el=0.2, eh=0.28, c=None, kl_coef=0.0, ref=None, ent_coef=0.0, ent=None
):
  """Value and d(loss)/d(logp) of the token-mean clipped surrogate, by hand."""
  a = adv[:, None]
  r = np.exp(logp - old)
  un, cl = -a * r, -a * np.clip(r, 1 - el, 1 + eh)
  per = np.maximum(un, cl)
  g = np.where(un >= cl, -a * r, 0.0)
  if c is not None:
    capped = (a < 0) & (per > -a * c)
    per = np.where(capped, -a * c, per)
    g = np.where(capped, 0.0, g)
  if kl_coef:
    d = ref - logp
    per = per + kl_coef * (np.exp(d) - d - 1)
    g = g + kl_coef * (1 - np.exp(d))
  if ent_coef:
    per = per - ent_coef * ent
  den = mask.sum()
  return (per * mask).sum() / den, g * mask / den


class PolicyLossTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_value_and_grad_match_numpy(self):
    logp, old, adv, mask, ref, ent = _inputs()
    configs = [dict(), dict(dual_clip_c=3.0), dict(kl_coef=0.1), dict(entropy_coef=0.01)]
    for cfg in configs:

      def f(lp):
        return losses.policy_loss(lp, old, adv, mask, ref_logp=ref, entropy=ent, **cfg)[0]  # noqa: B023

      val, grad = self.variant(jax.value_and_grad(f))(jnp.asarray(logp))
      want_v, want_g = _np_policy(
        logp,
        old,
        adv,
        mask,
        c=cfg.get("dual_clip_c"),
        kl_coef=cfg.get("kl_coef", 0.0),
        ref=ref,
        ent_coef=cfg.get("entropy_coef", 0.0),
        ent=ent,
      )
      np.testing.assert_allclose(val, want_v, rtol=1e-5, err_msg=str(cfg))
      np.testing.assert_allclose(grad, want_g, rtol=1e-5, atol=1e-7, err_msg=str(cfg))

  @chex.variants(with_jit=True, without_jit=True)
  def test_clip_metrics_analytic(self):
    # ratios e^{0.5}=1.65 (A>0: high clip), e^{-0.5}=0.61 (A<0: low clip), e^{0}=1, e^{2}=7.4
    logp = jnp.array([[0.5, -0.5, 0.0, 2.0]])
    old = jnp.zeros((1, 4))
    adv = jnp.array([[1.0, -1.0, 1.0, -1.0]])
    _, m = self.variant(functools.partial(losses.policy_loss, dual_clip_c=3.0))(
      logp, old, adv, jnp.ones((1, 4))
    )
    s = losses.reduce_metrics(m)
    np.testing.assert_allclose(s["clip_frac_high"], 0.25)
    np.testing.assert_allclose(s["clip_frac_low"], 0.25)
    np.testing.assert_allclose(s["dual_clip_frac"], 0.25)
    np.testing.assert_allclose(s["clip_frac"], 0.5)
    np.testing.assert_allclose(s["ratio_mean"], np.exp([0.5, -0.5, 0.0, 2.0]).mean(), rtol=1e-6)
    np.testing.assert_allclose(s["ppo_kl"], -0.5, rtol=1e-6)

  def test_masked_tokens_get_zero_gradient(self):
    logp, old, adv, mask, _, _ = _inputs(1)
    old = np.where(mask > 0, old, 1e4).astype(np.float32)  # garbage where masked
    grad = jax.grad(lambda lp: losses.policy_loss(lp, old, adv, mask)[0])(jnp.asarray(logp))
    assert np.all(np.asarray(grad)[mask == 0] == 0.0)
    assert np.all(np.isfinite(grad))
    assert np.any(np.asarray(grad)[mask > 0] != 0.0)

  def test_micro_batches_sum_to_whole_batch(self):
    logp, old, adv, mask, _, ent = _inputs(2)
    f = lambda lp, o, a, m, e, norm=None: losses.policy_loss(
      lp, o, a, m, entropy=e, normalizer=norm
    )
    vg = jax.jit(jax.value_and_grad(f, has_aux=True))
    (whole, wm), wg = vg(logp, old, adv, mask, ent)
    total = mask.sum()
    loss_sum, grads, sums = 0.0, [], None
    for rows in (slice(0, 1), slice(1, 3), slice(3, 4)):  # unequal micro-batches
      (l, m), g = vg(logp[rows], old[rows], adv[rows], mask[rows], ent[rows], total)
      loss_sum += l
      grads.append(g)
      sums = losses.add_metric_sums(sums, m)
    np.testing.assert_allclose(loss_sum, whole, rtol=1e-6)
    np.testing.assert_allclose(np.concatenate(grads), wg, rtol=1e-6, atol=1e-8)
    a, b = losses.reduce_metrics(sums), losses.reduce_metrics(wm)
    for k in b:
      np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7, err_msg=k)

  def test_seq_mean_aggregations(self):
    logp, old, adv, mask, _, _ = _inputs(3)
    mask[2] = 0.0  # an empty sequence is left out of the mean
    r = np.exp(logp - old)
    a = adv[:, None]
    per = np.maximum(-a * r, -a * np.clip(r, 0.8, 1.28)) * mask
    rows = [0, 1, 3]
    want_tm = np.mean([per[i].sum() / mask[i].sum() for i in rows])
    want_ts = np.mean([per[i].sum() for i in rows])
    got_tm, _ = losses.policy_loss(logp, old, adv, mask, agg="seq-mean-token-mean")
    got_ts, _ = losses.policy_loss(logp, old, adv, mask, agg="seq-mean-token-sum")
    np.testing.assert_allclose(got_tm, want_tm, rtol=1e-5)
    np.testing.assert_allclose(got_ts, want_ts, rtol=1e-5)

  def test_entropy_from_logits_and_errors(self):
    logp, old, adv, mask, _, _ = _inputs(4)
    logits = np.random.default_rng(0).normal(size=(N, T, V)).astype(np.float32)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    ent = -(p * np.log(p)).sum(-1)
    _, m = losses.policy_loss(logp, old, adv, mask, logits=logits)
    np.testing.assert_allclose(
      losses.reduce_metrics(m)["entropy"], (ent * mask).sum() / mask.sum(), rtol=1e-5
    )
    with pytest.raises(ValueError, match="ref_logp"):
      losses.policy_loss(logp, old, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="entropy"):
      losses.policy_loss(logp, old, adv, mask, entropy_coef=0.1)
    with pytest.raises(ValueError, match="adv"):
      losses.policy_loss(logp, old, adv[:2], mask)
    assert registry.get("policy_loss", "grpo_roc") is losses.policy_loss


class SftLossTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_value_grad_metrics(self):
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(N, T, V)).astype(np.float32)
    targets = rng.integers(0, V, (N, T)).astype(np.int32)
    mask = (rng.uniform(size=(N, T)) < 0.6).astype(np.float32)
    mask[0, 0] = 1.0
    f = lambda lg: losses.sft_loss(lg, targets, mask)
    (val, m), grad = self.variant(jax.value_and_grad(f, has_aux=True))(jnp.asarray(logits))
    z = logits - logits.max(-1, keepdims=True)
    logsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
    onehot = np.eye(V)[targets]
    want = -(np.take_along_axis(logsm, targets[..., None], -1)[..., 0] * mask).sum() / mask.sum()
    want_g = (np.exp(logsm) - onehot) * mask[..., None] / mask.sum()
    np.testing.assert_allclose(val, want, rtol=1e-5)
    np.testing.assert_allclose(grad, want_g, rtol=1e-4, atol=1e-7)
    s = losses.reduce_metrics(m)
    np.testing.assert_allclose(s["loss"], want, rtol=1e-5)
    acc = ((logits.argmax(-1) == targets) * mask).sum() / mask.sum()
    np.testing.assert_allclose(s["accuracy"], acc, rtol=1e-6)
    lp, ent = losses.token_logprobs_and_entropy(logits, targets)
    np.testing.assert_allclose(
      lp, np.take_along_axis(logsm, targets[..., None], -1)[..., 0], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(ent, -(np.exp(logsm) * logsm).sum(-1), rtol=1e-5)


@pytest.mark.parametrize("jit", [False, True])
def test_reduce_metrics_empty_denominator_is_nan(jit):
  sums = {
    "loss": (jnp.float32(0.0), jnp.float32(0.0)),
    "clip_frac": (jnp.float32(3.0), jnp.float32(4.0)),
  }
  out = (jax.jit(losses.reduce_metrics) if jit else losses.reduce_metrics)(sums)
  assert np.isnan(out["loss"])  # nothing to average: not a measured 0.0
  np.testing.assert_allclose(out["clip_frac"], 0.75)
  # A fully masked batch: every token metric is NaN, the loss itself stays 0 (no gradient).
  loss, m = losses.policy_loss(
    jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.ones((2,)), jnp.zeros((2, 3))
  )
  assert float(loss) == 0.0 and all(np.isnan(v) for v in losses.reduce_metrics(m).values())
