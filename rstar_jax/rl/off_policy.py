"""Off-policy corrections between the sampler (behaviour) and the learner (proximal) policy.

With an inference engine that samples in bf16 / a different kernel, or a rollout that lags
the learner by some weight versions, the tokens were drawn from a behaviour policy π_behav
that differs from the proximal policy π_prox whose log-probs the learner recomputes (the
"old" policy of the PPO ratio). Both pieces below keep the PPO ratio r_t = π_θ / π_prox and
re-weight each token's clipped surrogate by a stop-gradient importance weight

    ρ_t = π_prox(y_t) / π_behav(y_t) = exp(prox_logp_t - behav_logp_t):

* ``truncate`` — token-level truncated importance sampling (TIS; Yao et al. 2025, "Your
  Efficient RL Framework Secretly Brings You Off-Policy RL Training"; ASTER uses cap 2.0):
      w_t = min(ρ_t, C)
* ``mask`` — AReaL's decoupled PPO objective (Fu et al. 2025, "AReaL: A Large-Scale
  Asynchronous Reinforcement Learning System for Language Reasoning", Eq. 5):
      J(θ) = E_t[ ρ_t · min(r_t A_t, clip(r_t, 1 - ε, 1 + ε) A_t) ]
  with AReaL's optional cap dropping (w_t = 0) the tokens whose ρ_t exceeds it:
      w_t = ρ_t · 1[ρ_t <= C]   (C = None: w_t = ρ_t)

Loss per token: ℓ_t = w_t · ℓ^clip_t with ℓ^clip_t the (dual-)clipped surrogate of
`rstar_jax.rl.losses.policy_loss`, aggregated by the same token-mean. When the sampler is the
learner (behav_logp == prox_logp) every ρ_t = exp(0) = 1, so both reduce exactly to
`policy_loss` (weights are 1.0 bit for bit, and C >= 1 never truncates them).

The functions are registered under kind "off_policy_loss" (not "policy_loss": they take the
extra behaviour log-probs, so they cannot be called with `policy_loss`'s positional layout),
all with one signature ``(logp, prox_logp, behav_logp, adv, loss_mask, *, cap, **ppo_kwargs)``
so the learner selects one by name (``rl.off_policy_loss``) and passes ``rl.tis_cap`` as
``cap``; the RL batch carries the sampler's log-probs under ``behaviour_logprobs``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rstar_jax.rl import losses, registry

IS_MODES = ("truncate", "mask")


def behaviour_weights(
  prox_logp: jax.Array,
  behav_logp: jax.Array,
  loss_mask: jax.Array,
  *,
  cap: float | None,
  mode: str = "truncate",
  log_ratio_clamp: float = 20.0,
) -> tuple[jax.Array, losses.Metrics]:
  """Per-token importance weights w [N, T] (no gradient) and their metrics.

  Args:
      prox_logp: [N, T] proximal (learner-recomputed) log-probs.
      behav_logp: [N, T] behaviour (sampler) log-probs of the same tokens.
      loss_mask: [N, T]; off-mask weights are 0.
      cap: C; "truncate" needs a value >= 1, "mask" accepts None (no cap).
      mode: "truncate" (TIS, w = min(ρ, C)) or "mask" (AReaL, w = ρ·1[ρ <= C]).
  Returns:
      w [N, T] float32; metrics {name: (num, den)}: ``is_weight_mean`` (mean w),
      ``is_ratio_mean`` (mean ρ), ``is_capped_frac`` (tokens with ρ > C), ``behav_kl``
      (k1 estimate log π_prox - log π_behav).
  """
  if mode not in IS_MODES:
    raise ValueError(f"behaviour_weights: mode must be one of {IS_MODES}, got {mode!r}")
  if mode == "truncate" and (cap is None or not cap >= 1.0):
    raise ValueError(f"behaviour_weights: the TIS cap must be a number >= 1, got {cap!r}")
  if cap is not None and not cap > 0:
    raise ValueError(f"behaviour_weights: cap must be > 0 or None, got {cap!r}")
  if prox_logp.shape != behav_logp.shape or prox_logp.shape != loss_mask.shape:
    raise ValueError(
      f"behaviour_weights: prox_logp, behav_logp and loss_mask must share a "
      f"shape [N, T]; got {prox_logp.shape}, {behav_logp.shape}, "
      f"{loss_mask.shape}"
    )
  mask = loss_mask.astype(jnp.float32)
  d = jnp.where(mask > 0, prox_logp.astype(jnp.float32) - behav_logp.astype(jnp.float32), 0.0)
  rho = jnp.exp(jnp.clip(d, -log_ratio_clamp, log_ratio_clamp))
  capped = (rho > cap) if cap is not None else jnp.zeros_like(rho, dtype=bool)
  if mode == "truncate":
    w = jnp.minimum(rho, cap)
  else:
    w = jnp.where(capped, 0.0, rho)
  w = jax.lax.stop_gradient(jnp.where(mask > 0, w, 0.0))
  ntok = jnp.sum(mask)
  sg = jax.lax.stop_gradient
  metrics = {
    "is_weight_mean": (sg(jnp.sum(w * mask)), ntok),
    "is_ratio_mean": (sg(jnp.sum(rho * mask)), ntok),
    "is_capped_frac": (jnp.sum(capped.astype(jnp.float32) * mask), ntok),
    "behav_kl": (sg(jnp.sum(d * mask)), ntok),
  }
  return w, metrics


@registry.register("off_policy_loss", "tis")
def tis_policy_loss(
  logp: jax.Array,
  prox_logp: jax.Array,
  behav_logp: jax.Array,
  adv: jax.Array,
  loss_mask: jax.Array,
  *,
  cap: float = 2.0,
  **ppo_kwargs,
) -> tuple[jax.Array, losses.Metrics]:
  """Clipped surrogate with token-level truncated importance sampling.

      ℓ_t = min(π_prox/π_behav, C) · max(-A r_t, -A clip(r_t, 1-ε_low, 1+ε_high)),
      r_t = π_θ/π_prox,  L = Σ m_t ℓ_t / Σ m_t  (dual clip, KL, entropy as `policy_loss`)

  Args:
      logp, prox_logp, behav_logp: [N, T] current, proximal and behaviour log-probs.
      adv: [N] or [N, T]; loss_mask: [N, T].
      cap: C (ASTER: 2.0).
      **ppo_kwargs: passed to `rstar_jax.rl.losses.policy_loss` (eps_low, dual_clip_c, ...).
  Returns:
      (loss, metrics): `policy_loss`'s metrics plus those of `behaviour_weights`.
  """
  w, wm = behaviour_weights(prox_logp, behav_logp, loss_mask, cap=cap, mode="truncate")
  loss, m = losses.policy_loss(logp, prox_logp, adv, loss_mask, is_weights=w, **ppo_kwargs)
  m.update(wm)
  return loss, m


@registry.register("off_policy_loss", "decoupled_ppo")
def decoupled_policy_loss(
  logp: jax.Array,
  prox_logp: jax.Array,
  behav_logp: jax.Array,
  adv: jax.Array,
  loss_mask: jax.Array,
  *,
  cap: float | None = None,
  **ppo_kwargs,
) -> tuple[jax.Array, losses.Metrics]:
  """AReaL's decoupled PPO objective.

      ℓ_t = w_t · max(-A r_t, -A clip(r_t, 1-ε_low, 1+ε_high)),  r_t = π_θ/π_prox,
      w_t = (π_prox/π_behav) · 1[π_prox/π_behav <= C]   (C None: no cap)

  Args and returns as `tis_policy_loss`; ``cap`` is AReaL's C (``behav_imp_weight_cap``; tokens
  above it get weight 0, but stay in the token-mean's denominator, as in AReaL).
  """
  w, wm = behaviour_weights(prox_logp, behav_logp, loss_mask, cap=cap, mode="mask")
  loss, m = losses.policy_loss(logp, prox_logp, adv, loss_mask, is_weights=w, **ppo_kwargs)
  m.update(wm)
  return loss, m
