"""Group-relative advantages, computed on the G rollouts kept by RoC (rStar2-Agent Eq. 7)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rstar_jax.rl import registry


@registry.register("advantage", "grpo")
def grpo_advantages(
  selected_rewards: jax.Array,
  eps: float = 1e-6,
  unbiased_std: bool = True,
  normalize_by_std: bool = True,
  valid: jax.Array | None = None,
) -> jax.Array:
  """GRPO advantage per rollout.

      Â_i = (r_i - mean_j r_j) / (std_j r_j + eps)        over the valid rollouts of a group

  std is Bessel-corrected (torch.std, as verl) when ``unbiased_std``. A group with a single
  valid rollout uses mean 0 and std 1 (verl's convention), so Â = r / (1 + eps). With
  ``normalize_by_std=False`` the advantage is r_i - mean (Dr. GRPO style).

  Args:
      selected_rewards: [B, G] float.
      valid: optional [B, G] bool; padding rows (False) get advantage 0 and are left out of
          the group statistics.
  Returns:
      [B, G] float32 advantages; the learner broadcasts them to every loss-mask token.
  """
  r = selected_rewards.astype(jnp.float32)
  v = jnp.ones_like(r) if valid is None else valid.astype(jnp.float32)
  n = jnp.sum(v, axis=-1, keepdims=True)
  mean = jnp.sum(r * v, axis=-1, keepdims=True) / jnp.maximum(n, 1.0)
  sq = jnp.sum(jnp.square(r - mean) * v, axis=-1, keepdims=True)
  dof = n - 1.0 if unbiased_std else n
  std = jnp.sqrt(sq / jnp.maximum(dof, 1.0))
  single = n <= 1.0
  mean = jnp.where(single, 0.0, mean)
  std = jnp.where(single, 1.0, std)
  adv = r - mean
  if normalize_by_std:
    adv = adv / (std + eps)
  return adv * v


@registry.register("advantage_transform", "scale_negative")
def scale_negative_advantages(advantages: jax.Array, scale: float | jax.Array) -> jax.Array:
  """Multiplies the negative advantages by ``scale`` and leaves the others unchanged.

      Â'_i = Â_i            if Â_i >= 0
      Â'_i = scale * Â_i    otherwise

  ``scale = 1`` is GRPO (rStar2-Agent, the default). ``scale < 1`` moves the effective baseline
  below the group mean, i.e. asymmetric REINFORCE: pushing sampled tokens down is much
  easier than pushing them up (their log-probabilities fall ~10x faster per update on a tiny
  model), and an unweighted negative gradient spreads the freed probability mass over
  other tokens, so the policy's entropy grows instead of the correct mode sharpening.

  Args:
      advantages: any shape, float.
      scale: float or scalar array in [0, 1] (not checked here, so it can be traced).
  Returns:
      float32 array of the same shape.
  """
  a = advantages.astype(jnp.float32)
  return jnp.where(a < 0, a * jnp.asarray(scale, jnp.float32), a)
