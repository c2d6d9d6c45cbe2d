"""Resample-on-Correct (RoC): down-sample 2G rollouts per prompt to G (rStar2-Agent §2.2.3).

All functions are pure, jittable and vmappable with static shapes. A rollout is *positive*
when its reward is > 0 (binary rewards: 1 = correct), *negative* otherwise.

Counts (both modes; rStar2-Agent paper and rstar2_agent/down_sample/roc.py in microsoft/rStar): with N rollouts in a group, n_neg negatives and
n_pos positives,

    k_neg = round_half_even(n_neg * G / N),   k_pos = G - k_neg,

then k_pos is clipped so that each side keeps at least min(min_pos, n_pos) /
min(min_neg, n_neg) and neither side takes more rollouts than it has.

Selection:
  * negatives: uniformly at random without replacement (paper: "original distribution").
  * positives, ``mode="paper"``: sampled without replacement with probability
    ∝ w_i = 1 / (p_total_i + eps) (successive sampling, done as Gumbel-top-k:
    top-k of log w_i + Gumbel_i).
  * positives, ``mode="released"``: the k_pos lowest penalties (stable: ties by rollout index),
    as in the released code's ``resample_of_correct``.
  * ``mode="random"`` (plain GRPO down-sampling, e.g. the RoC ablation): G of the N rollouts
    uniformly at random without replacement, regardless of reward and penalty (no minima).

Each mode is registered in `rstar_jax.rl.registry` under kind "downsample" (the config's
``rl.roc_mode`` names one); a registered function has the signature of `roc_paper`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rstar_jax.rl import registry

MODES = ("paper", "released", "random")


def informative_groups(rewards: jax.Array) -> jax.Array:
  """True where a group has both a positive and a negative rollout.

  Args:
      rewards: [B, N] float, N = 2G rollouts per prompt.
  Returns:
      [B] bool. All-correct and all-wrong groups are False (their GRPO advantage is 0).
  """
  pos = rewards > 0
  return jnp.any(pos, axis=-1) & jnp.any(~pos, axis=-1)


def group_outcome_counts(rewards: jax.Array) -> dict[str, jax.Array]:
  """Counts of all-correct / all-wrong / informative groups in a batch (for step metrics).

  Args:
      rewards: [B, N] float.
  Returns:
      dict of int32 scalars: ``all_correct``, ``all_wrong``, ``informative``.
  """
  pos = rewards > 0
  all_c = jnp.all(pos, axis=-1)
  all_w = jnp.all(~pos, axis=-1)
  return {
    "all_correct": jnp.sum(all_c).astype(jnp.int32),
    "all_wrong": jnp.sum(all_w).astype(jnp.int32),
    "informative": jnp.sum(~all_c & ~all_w).astype(jnp.int32),
  }


def _round_half_even_div(num: jax.Array, den: int) -> jax.Array:
  """round_half_even(num / den) for int arrays num >= 0 and a static int den > 0, exactly."""
  q, r = num // den, num % den
  up = (2 * r > den) | ((2 * r == den) & (q % 2 == 1))
  return q + up.astype(num.dtype)


def roc_counts(
  rewards: jax.Array, group_size: int, min_pos: int = 2, min_neg: int = 2
) -> tuple[jax.Array, jax.Array]:
  """(k_pos, k_neg) per group: the proportional split of ``group_size`` slots with minima.

  Args:
      rewards: [B, N] float.
  Returns:
      k_pos, k_neg: [B] int32 with k_pos + k_neg == group_size, k_pos <= n_pos, k_neg <= n_neg.
  """
  _check_static(rewards.shape[-1], group_size, min_pos, min_neg)
  n = rewards.shape[-1]
  n_pos = jnp.sum(rewards > 0, axis=-1).astype(jnp.int32)
  n_neg = n - n_pos
  # Exact integer arithmetic: float n_neg*G/N can land a hair off .5 and break half-even.
  k_neg_prop = _round_half_even_div(n_neg * group_size, n)
  lo = jnp.maximum(jnp.minimum(min_pos, n_pos), group_size - n_neg)
  hi = jnp.minimum(n_pos, group_size - jnp.minimum(min_neg, n_neg))
  k_pos = jnp.clip(group_size - k_neg_prop, lo, hi).astype(jnp.int32)
  return k_pos, (group_size - k_pos).astype(jnp.int32)


def _check_static(n: int, group_size: int, min_pos: int, min_neg: int) -> None:
  if not 1 <= group_size <= n:
    raise ValueError(f"roc: group_size must be in [1, {n}] (rollouts per group), got {group_size}")
  if min_pos < 0 or min_neg < 0 or min_pos + min_neg > group_size:
    raise ValueError(
      f"roc: need min_pos, min_neg >= 0 and min_pos + min_neg <= group_size="
      f"{group_size}, got min_pos={min_pos}, min_neg={min_neg}"
    )


def _rank_within(member: jax.Array, score: jax.Array) -> jax.Array:
  """Rank (0 = best = highest score) of each member among members; non-members rank >= count."""
  order = jnp.argsort(jnp.where(member, -score, jnp.inf), stable=True)
  return jnp.argsort(order, stable=True)


def _downsample_one(key, rewards, penalties, k_pos, k_neg, mode, eps):
  n = rewards.shape[0]
  pos = rewards > 0
  k_gpos, k_gneg = jax.random.split(key)
  if mode == "paper":
    log_w = -jnp.log(jnp.maximum(penalties.astype(jnp.float32), 0.0) + eps)
    pos_score = log_w + jax.random.gumbel(k_gpos, (n,))
  else:
    # Negated so that "highest score first" is "lowest penalty first"; stable argsort breaks
    # ties by rollout index like the code's stable sort.
    pos_score = -penalties.astype(jnp.float32)
  neg_score = jax.random.gumbel(k_gneg, (n,))
  keep = (pos & (_rank_within(pos, pos_score) < k_pos)) | (
    ~pos & (_rank_within(~pos, neg_score) < k_neg)
  )
  # Kept rollouts first, each side in ascending rollout index.
  return jnp.argsort(~keep, stable=True)


def roc_downsample(
  key: jax.Array,
  rewards: jax.Array,
  penalties: jax.Array,
  *,
  group_size: int,
  mode: str = "paper",
  min_pos: int = 2,
  min_neg: int = 2,
  eps: float = 1e-6,
) -> jax.Array:
  """Indices of the G rollouts kept per group (module docstring gives the rule).

  Args:
      key: PRNG key (one for the whole batch; split per group inside).
      rewards: [B, N] float (N = 2G in rStar2-Agent); positive iff > 0.
      penalties: [B, N] float, p_total = p_err + p_format >= 0 (only read for positives).
      group_size: G (static), 1 <= G <= N.
      mode: "paper" (inverse-penalty sampling), "released" (lowest penalty first) or
          "random" (uniform, plain GRPO; rewards, penalties, minima and eps unused).
      min_pos, min_neg: minimum kept per side when available (static).
      eps: added to the penalty before inversion. With eps=1e-6 a zero-penalty positive
          outweighs a penalty-0.5 one about 5e5:1; raise it for a softer preference.
  Returns:
      [B, G] int32 distinct indices into the N axis, ascending within each group.
  """
  if mode not in MODES:
    raise ValueError(f"roc_downsample: mode must be one of {MODES}, got {mode!r}")
  if rewards.ndim != 2 or penalties.shape != rewards.shape:
    raise ValueError(
      f"roc_downsample: rewards and penalties must both be [B, N]; got "
      f"{rewards.shape} and {penalties.shape}"
    )
  if mode == "random":
    _check_static(rewards.shape[-1], group_size, 0, 0)
    return uniform_downsample(key, rewards.shape[0], rewards.shape[1], group_size)
  _check_static(rewards.shape[-1], group_size, min_pos, min_neg)
  return _downsample_batch(
    key,
    rewards,
    penalties,
    group_size=group_size,
    mode=mode,
    min_pos=min_pos,
    min_neg=min_neg,
    eps=eps,
  )


def uniform_downsample(key: jax.Array, batch: int, n: int, group_size: int) -> jax.Array:
  """[B, G] int32: G of N indices per group uniformly without replacement, ascending
  (plain GRPO down-sampling). One key per group, split from ``key``."""
  keys = jax.random.split(key, batch)
  idx = jax.vmap(lambda k: jnp.sort(jax.random.permutation(k, n)[:group_size]))(keys)
  return idx.astype(jnp.int32)


def _registered_roc(mode: str, doc: str):
  """A registered down-sampler for one RoC ``mode`` (the signature every "downsample" entry
  has; see `roc_downsample` for the arguments)."""

  def downsample(key: jax.Array, rewards: jax.Array, penalties: jax.Array, **kw) -> jax.Array:
    return roc_downsample(key, rewards, penalties, mode=mode, **kw)

  downsample.__name__ = downsample.__qualname__ = f"roc_{mode}"
  downsample.__doc__ = (
    f"{doc}\n\nKeywords as `roc_downsample`: group_size (required), min_pos, min_neg, eps."
  )
  return registry.register("downsample", mode)(downsample)


roc_paper = _registered_roc(
  "paper", "RoC, positives sampled ∝ 1 / (penalty + eps) (rStar2-Agent §2.2.3). [B, N] -> [B, G]."
)
roc_released = _registered_roc(
  "released", "RoC, lowest-penalty positives first (released code). [B, N] -> [B, G]."
)


random_downsample = _registered_roc(
  "random", "Plain GRPO: G of N uniformly (ASTER; the RoC ablation). [B, N] -> [B, G]."
)


# Jitted once per static configuration: op-by-op dispatch of the vmapped sorts is slow eagerly.
@functools.partial(jax.jit, static_argnames=("group_size", "mode", "min_pos", "min_neg", "eps"))
def _downsample_batch(key, rewards, penalties, *, group_size, mode, min_pos, min_neg, eps):
  k_pos, k_neg = roc_counts(rewards, group_size, min_pos, min_neg)
  keys = jax.random.split(key, rewards.shape[0])
  order = jax.vmap(_downsample_one, in_axes=(0, 0, 0, 0, 0, None, None))(
    keys, rewards, penalties, k_pos, k_neg, mode, eps
  )
  return jnp.sort(order[:, :group_size], axis=-1).astype(jnp.int32)


def gather_groups(x: jax.Array, idx: jax.Array) -> jax.Array:
  """Select kept rollouts: x [B, N, ...], idx [B, G] int -> [B, G, ...]."""
  idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, idx, axis=1)
