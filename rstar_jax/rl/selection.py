"""The whole pure selection path of one RL step: [B, N] rewards + penalties -> kept rollouts.

    keep_group = informative_groups(rewards)           (if drop_zero_variance; else all True)
    idx        = downsample[mode](key, rewards, penalties)         [B, G] (N == G: identity)
    r_sel      = rewards[b, idx[b]]
    adv        = advantage[name](r_sel, valid = keep_group)        0 for dropped groups
    adv        = scale_negative(adv, neg_adv_scale)                (1 = GRPO)

rStar2-Agent: N = 2G rollouts per prompt, zero-variance groups dropped, RoC down-sampling
("paper" / "released") and GRPO advantages on the kept G (Eq. 7). Plain GRPO (ASTER, or the
RoC ablation): ``mode="random"``. ``mode`` and ``advantage`` are names in
`rstar_jax.rl.registry` (kinds "downsample" and "advantage"), so a user-registered variant is
selected the same way. Shapes are static, so the whole function jits (mode, names and sizes
static); it also runs eagerly (the RL loop calls it that way: each piece is then the same
compiled computation as when called alone).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rstar_jax.rl import advantages as adv_lib
from rstar_jax.rl import registry, roc


class Selection(NamedTuple):
  """Result of `select_rollouts` (B groups, G kept per group).

  Attributes:
      indices: [B, G] int32 kept rollout indices per group, ascending.
      keep_group: [B] bool, False for groups dropped by the zero-variance filter.
      keep: [B, G] bool keep mask (``keep_group`` broadcast over the kept rollouts).
      rewards: [B, G] float32 rewards of the kept rollouts.
      advantages: [B, G] float32; 0 where ``keep`` is False.
  """

  indices: jax.Array
  keep_group: jax.Array
  keep: jax.Array
  rewards: jax.Array
  advantages: jax.Array


def select_rollouts(
  key: jax.Array,
  rewards: jax.Array,
  penalties: jax.Array,
  *,
  group_size: int,
  mode: str = "paper",
  min_pos: int = 2,
  min_neg: int = 2,
  roc_eps: float = 1e-6,
  drop_zero_variance: bool = True,
  advantage: str = "grpo",
  adv_eps: float = 1e-6,
  unbiased_std: bool = True,
  neg_adv_scale: float | jax.Array = 1.0,
) -> Selection:
  """Zero-variance filter, down-sampling to G and advantages (module docstring).

  Args:
      key: PRNG key for the down-sampling.
      rewards: [B, N] float, positive iff > 0.
      penalties: [B, N] float, p_err + p_format >= 0 (RoC reads them for positives).
      group_size: G (static), 1 <= G <= N.
      mode: registered down-sampling name: "paper" | "released" | "random" | user's.
      min_pos, min_neg, roc_eps: RoC minima and penalty epsilon (static).
      advantage: registered advantage name ("grpo").
      adv_eps, unbiased_std: advantage settings.
      neg_adv_scale: negative advantages x this (may be traced).
  Returns:
      `Selection`.
  """
  if rewards.ndim != 2 or penalties.shape != rewards.shape:
    raise ValueError(
      f"select_rollouts: rewards and penalties must both be [B, N]; got "
      f"{rewards.shape} and {penalties.shape}"
    )
  rewards = jnp.asarray(rewards, jnp.float32)
  penalties = jnp.asarray(penalties, jnp.float32)
  b, n = rewards.shape
  if drop_zero_variance:
    keep_group = roc.informative_groups(rewards)
  else:
    keep_group = jnp.ones((b,), bool)
  if n == group_size:
    idx = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
  else:
    idx = registry.get("downsample", mode)(
      key, rewards, penalties, group_size=group_size, min_pos=min_pos, min_neg=min_neg, eps=roc_eps
    )
    idx = jnp.asarray(idx, jnp.int32)
  selected = jnp.take_along_axis(rewards, idx, axis=1)
  keep = jnp.broadcast_to(keep_group[:, None], selected.shape)
  adv = registry.get("advantage", advantage)(
    selected, eps=adv_eps, unbiased_std=unbiased_std, valid=keep
  )
  adv = adv_lib.scale_negative_advantages(adv, neg_adv_scale)
  return Selection(indices=idx, keep_group=keep_group, keep=keep, rewards=selected, advantages=adv)


_STATIC = (
  "group_size",
  "mode",
  "min_pos",
  "min_neg",
  "roc_eps",
  "drop_zero_variance",
  "advantage",
  "adv_eps",
  "unbiased_std",
)
select_rollouts_jit = jax.jit(select_rollouts, static_argnames=_STATIC)
select_rollouts_jit.__doc__ = "`select_rollouts` under `jax.jit` (names and sizes static)."
