"""Policy and SFT losses with (numerator, denominator) metrics (STYLE convention 9).

Exact token-mean under micro-batching / data parallelism
--------------------------------------------------------
Every loss returns ``(loss, metrics)`` where ``metrics[name] = (numerator, denominator)``, both
float32 scalars that ADD across micro-batches and devices. A learner that splits a batch into
micro-batches does:

    total = sum of loss_mask over the WHOLE batch             # computed once, before the loop
    for mb in micro_batches:
        loss_mb, m = policy_loss(..., normalizer=total)      # = sum_mb(per-token loss) / total
        grads += grad(loss_mb); sums = add_metric_sums(sums, m)
    metrics = reduce_metrics(sums)                           # num / den per metric

so the summed micro-batch losses (and gradients) equal the whole-batch token-mean exactly.
Across devices, ``jax.lax.psum`` the numerators and denominators before ``reduce_metrics``.
Without ``normalizer`` the loss is the batch's own mean (numerator / denominator of ``loss``).
For ``agg="seq-mean-*"`` the denominator counts sequences, so pass the whole batch's number of
sequences with at least one mask token as ``normalizer``.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from rstar_jax.rl import registry

Metrics = dict[str, tuple[jax.Array, jax.Array]]
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_ESTIMATORS = ("k1", "k2", "k3")
_sg = jax.lax.stop_gradient


def token_logprobs_and_entropy(
  logits: jax.Array, targets: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """log p(target) and the entropy of each predictive distribution: the project's one
  log-prob / entropy function (the learner, the SFT loss and the policy loss use it).

  Alignment ("prediction-aligned"): ``logits[n, t]`` is the distribution ``targets[n, t]``
  was drawn from. For causal-LM logits over a sequence ``ids`` pass ``logits[:, :-1]`` and
  ``ids[:, 1:]``; `rstar_jax.learner.steps` does this and pads column 0 to get the batch's
  token-aligned layout (column t about ``ids[:, t]``).

  Args:
      logits: [N, T, V] (prediction-aligned with ``targets``).
      targets: [N, T] int.
  Returns:
      logp [N, T] float32, entropy [N, T] float32 (nats).
  """
  logits = logits.astype(jnp.float32)
  logz = jax.nn.logsumexp(logits, axis=-1)
  tgt = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
  entropy = logz - jnp.sum(jax.nn.softmax(logits, axis=-1) * logits, axis=-1)
  return tgt - logz, entropy


def masked_sum(x: jax.Array, mask: jax.Array) -> jax.Array:
  return jnp.sum(x * mask)


def add_metric_sums(acc: Metrics | None, new: Mapping[str, tuple[jax.Array, jax.Array]]) -> Metrics:
  """Adds (num, den) pairs key-wise (micro-batch accumulation); ``acc=None`` starts a sum."""
  if acc is None:
    return dict(new)
  return {k: (acc[k][0] + new[k][0], acc[k][1] + new[k][1]) for k in acc}


def reduce_metrics(sums: Mapping[str, tuple[jax.Array, jax.Array]]) -> dict[str, jax.Array]:
  """{name: (num, den)} -> {name: num / den}. Jittable.

  A metric with nothing to average over (den == 0, e.g. a batch whose loss mask is all
  zeros) is NaN, not 0.0: a 0.0 clip fraction or loss would read as a real measurement.
  The metrics logger writes NaN as JSON ``null``; use ``jnp.nan_to_num`` to get zeros.
  """
  return {
    k: jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), jnp.nan)
    for k, (num, den) in sums.items()
  }


def _aggregate(per_token: jax.Array, mask: jax.Array, agg: str):
  """(numerator, denominator) of the aggregated loss (see module docstring)."""
  if agg == "token-mean":
    return jnp.sum(per_token * mask), jnp.sum(mask)
  tok = jnp.sum(per_token * mask, axis=-1)
  cnt = jnp.sum(mask, axis=-1)
  has = (cnt > 0).astype(jnp.float32)
  if agg == "seq-mean-token-mean":
    tok = tok / jnp.maximum(cnt, 1.0)
  return jnp.sum(tok * has), jnp.sum(has)


def _kl(logp, ref_logp, estimator):
  d = ref_logp - logp  # log(p_ref / p)
  if estimator == "k1":
    return -d
  if estimator == "k2":
    return 0.5 * jnp.square(d)
  d = jnp.clip(d, -20.0, 20.0)
  return jnp.exp(d) - d - 1.0


@registry.register("policy_loss", "grpo_roc")
def policy_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  adv: jax.Array,
  loss_mask: jax.Array,
  *,
  eps_low: float = 0.2,
  eps_high: float = 0.28,
  dual_clip_c: float | None = None,
  kl_coef: float = 0.0,
  ref_logp: jax.Array | None = None,
  kl_estimator: str = "k3",
  entropy_coef: float = 0.0,
  entropy: jax.Array | None = None,
  logits: jax.Array | None = None,
  agg: str = "token-mean",
  normalizer: jax.Array | float | None = None,
  log_ratio_clamp: float = 20.0,
  is_weights: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """PPO-clip surrogate with Clip-Higher (rStar2-Agent Eq. 6), token-mean by default.

      r_t   = exp(clamp(logp_t - old_logp_t, ±log_ratio_clamp))
      ℓ_t   = max(-A r_t, -A clip(r_t, 1 - eps_low, 1 + eps_high))
      dual clip (c set, A < 0):  ℓ_t = min(ℓ_t, -A c)
      L     = Σ_t m_t ℓ_t / Σ_t m_t  +  kl_coef · KL  -  entropy_coef · H      (token-mean)

  KL is the masked mean of an estimator of KL(π || π_ref): k1 = logp - ref, k2 = ½(logp -
  ref)², k3 = exp(ref - logp) - (ref - logp) - 1. H is the masked mean entropy. The defaults
  (no dual clip, no KL, no entropy) are the paper's; the released verl code adds
  ``dual_clip_c=3.0``.

  Args:
      logp: [N, T] float, current-policy log-prob of each token (differentiable).
      old_logp: [N, T] float, behaviour-policy log-probs (no gradient flows into them).
      adv: [N] (one per sequence) or [N, T] float advantages.
      loss_mask: [N, T], 1 for model-generated tokens; 0 tokens get exactly zero gradient.
      ref_logp: [N, T], required when kl_coef != 0.
      entropy: [N, T], or ``logits`` [N, T, V] aligned with logp; required when
          entropy_coef != 0 (entropy is also reported as a metric whenever given).
      agg: "token-mean" (paper), "seq-mean-token-mean" or "seq-mean-token-sum".
      normalizer: divide the summed loss by this instead of this batch's own denominator,
          e.g. the whole batch's mask-token count under gradient accumulation.
      is_weights: [N, T] per-token weights w_t multiplying the clipped surrogate
          (ℓ_t -> w_t ℓ_t, no gradient), e.g. the behaviour-policy correction of
          `rstar_jax.rl.off_policy`; None = all ones.
  Returns:
      loss: float32 scalar.
      metrics: {name: (numerator, denominator)}: ``loss``, ``pg_loss``, ``clip_frac`` (any
          clip active), ``clip_frac_low`` (A<0, r<1-eps_low), ``clip_frac_high`` (A>0,
          r>1+eps_high), ``dual_clip_frac``, ``approx_kl`` (k3 of old vs new), ``ppo_kl``
          (k1, verl's), ``ratio_mean``, ``ratio_abs_dev`` (|r-1|), plus ``kl`` and
          ``entropy`` when available. Token metrics use the mask-token count as denominator.
  """
  if agg not in AGGREGATIONS:
    raise ValueError(f"policy_loss: agg must be one of {AGGREGATIONS}, got {agg!r}")
  if kl_estimator not in KL_ESTIMATORS:
    raise ValueError(
      f"policy_loss: kl_estimator must be one of {KL_ESTIMATORS}, got {kl_estimator!r}"
    )
  if logp.shape != old_logp.shape or logp.shape != loss_mask.shape or logp.ndim != 2:
    raise ValueError(
      f"policy_loss: logp, old_logp and loss_mask must all be [N, T]; got "
      f"{logp.shape}, {old_logp.shape}, {loss_mask.shape}"
    )
  if adv.shape not in (logp.shape[:1], logp.shape):
    raise ValueError(
      f"policy_loss: adv must be [N] or [N, T] with [N, T]={logp.shape}, got {adv.shape}"
    )
  if kl_coef and ref_logp is None:
    raise ValueError("policy_loss: kl_coef != 0 needs ref_logp [N, T]")
  if entropy_coef and entropy is None and logits is None:
    raise ValueError("policy_loss: entropy_coef != 0 needs entropy [N, T] or logits [N, T, V]")
  if dual_clip_c is not None and not dual_clip_c > 1.0:
    raise ValueError(f"policy_loss: dual_clip_c must be > 1, got {dual_clip_c}")

  mask = loss_mask.astype(jnp.float32)
  logp = logp.astype(jnp.float32)
  old_logp = _sg(old_logp.astype(jnp.float32))
  a = _sg(adv.astype(jnp.float32))
  a = a[:, None] if a.ndim == 1 else a
  # Masked positions can hold garbage (pad ids): keep them finite so 0 * x stays 0 in grads.
  log_ratio = jnp.where(mask > 0, logp - old_logp, 0.0)
  ratio = jnp.exp(jnp.clip(log_ratio, -log_ratio_clamp, log_ratio_clamp))
  unclipped = -a * ratio
  clipped = -a * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  per_token = jnp.maximum(unclipped, clipped)
  if dual_clip_c is not None:
    dual = (a < 0) & (per_token > -a * dual_clip_c)
    per_token = jnp.where(a < 0, jnp.minimum(per_token, -a * dual_clip_c), per_token)
  else:
    dual = jnp.zeros_like(mask, dtype=bool)
  if is_weights is not None:
    if is_weights.shape != logp.shape:
      raise ValueError(
        f"policy_loss: is_weights must be [N, T]={logp.shape}, got {is_weights.shape}"
      )
    per_token = jnp.where(mask > 0, _sg(is_weights.astype(jnp.float32)), 0.0) * per_token

  total = per_token
  extras: Metrics = {}
  ntok = jnp.sum(mask)
  if ref_logp is not None:
    kl = _kl(logp, _sg(ref_logp.astype(jnp.float32)), kl_estimator)
    kl = jnp.where(mask > 0, kl, 0.0)
    extras["kl"] = (_sg(masked_sum(kl, mask)), ntok)
    if kl_coef:
      total = total + kl_coef * kl
  if entropy is None and logits is not None:
    entropy = token_logprobs_and_entropy(logits, jnp.zeros(logp.shape, jnp.int32))[1]
  if entropy is not None:
    entropy = jnp.where(mask > 0, entropy.astype(jnp.float32), 0.0)
    extras["entropy"] = (_sg(masked_sum(entropy, mask)), ntok)
    if entropy_coef:
      total = total - entropy_coef * entropy

  num, den = _aggregate(total, mask, agg)
  norm = jnp.maximum(den, 1.0) if normalizer is None else normalizer
  loss = num / norm

  f = lambda b: masked_sum(b.astype(jnp.float32), mask)
  pg_num, _ = _aggregate(per_token, mask, agg)
  metrics: Metrics = {
    "loss": (_sg(num), den),
    "pg_loss": (_sg(pg_num), den),
    "clip_frac": (f(clipped > unclipped), ntok),
    "clip_frac_low": (f((a < 0) & (ratio < 1.0 - eps_low)), ntok),
    "clip_frac_high": (f((a > 0) & (ratio > 1.0 + eps_high)), ntok),
    "dual_clip_frac": (f(dual), ntok),
    "approx_kl": (_sg(f(ratio - 1.0 - jnp.log(ratio))), ntok),
    "ppo_kl": (_sg(f(-log_ratio)), ntok),
    "ratio_mean": (_sg(f(ratio)), ntok),
    "ratio_abs_dev": (_sg(f(jnp.abs(ratio - 1.0))), ntok),
  }
  metrics.update(extras)
  return loss, metrics


@registry.register("sft_loss", "nll")
def sft_loss(
  logits: jax.Array,
  targets: jax.Array,
  loss_mask: jax.Array,
  *,
  normalizer: jax.Array | float | None = None,
) -> tuple[jax.Array, Metrics]:
  """Token-mean negative log-likelihood.

      L = -Σ_t m_t log softmax(logits_t)[target_t] / Σ_t m_t

  Args:
      logits: [N, T, V], ``logits[n, t]`` predicts ``targets[n, t]`` (already shifted).
      targets: [N, T] int.
      loss_mask: [N, T], 1 = train on this token.
      normalizer: as in `policy_loss` (whole-batch token count for gradient accumulation).
  Returns:
      loss scalar; metrics {name: (num, den)}: ``loss`` (NLL), ``entropy``, ``accuracy``
      (argmax == target).
  """
  if logits.shape[:2] != targets.shape or targets.shape != loss_mask.shape:
    raise ValueError(
      f"sft_loss: expected logits [N, T, V], targets and loss_mask [N, T]; got "
      f"{logits.shape}, {targets.shape}, {loss_mask.shape}"
    )
  mask = loss_mask.astype(jnp.float32)
  logp, ent = token_logprobs_and_entropy(logits, targets)
  num = -masked_sum(jnp.where(mask > 0, logp, 0.0), mask)
  den = jnp.sum(mask)
  loss = num / (jnp.maximum(den, 1.0) if normalizer is None else normalizer)
  acc = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return loss, {
    "loss": (_sg(num), den),
    "entropy": (_sg(masked_sum(ent, mask)), den),
    "accuracy": (masked_sum(acc, mask), den),
  }
