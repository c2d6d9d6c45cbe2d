"""Optimizer: AdamW with global-norm clipping and a warm-up-then-constant/cosine schedule.

Defaults follow rStar2-Agent's released script (docs/reference.md §6.3): AdamW, lr 1e-6, betas (0.9, 0.999),
weight decay 0.01, gradient clipping at global norm 1.0, linear warm-up over 20 optimizer steps,
then constant.

Warm-up convention: the k-th update (k = 0, 1, ...) since the optimizer was (re)initialised uses
``lr * min(1, (k + 1) / warmup_steps)``, so the first update is already non-zero and update
``warmup_steps - 1`` is the first at the peak. (torch's ``LambdaLR`` warm-up used by verl gives the
very first update lr 0; we do not copy that wasted step.) The schedule reads optax's own update
count, so `reset_optimizer` (a fresh ``tx.init``) restarts the warm-up.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

# The one optimizer config, with the user-facing field names (``lr``, ``grad_clip``: 0 = off,
# ``total_steps``: 0 = unset); re-exported here (``optim.OptimConfig``).
from rstar_jax.learner.optim_config import SCHEDULES, OptimConfig  # noqa: F401


def _check_schedule(config: OptimConfig) -> None:
  # ``total_steps`` 0 means "the loop sets it"; by the time the optimizer is built it must be.
  if config.schedule == "cosine" and config.total_steps <= config.warmup_steps:
    raise ValueError(
      f"optim.total_steps: expected > warmup_steps ({config.warmup_steps}) for a cosine "
      f"schedule, got {config.total_steps} (0 = set by the loop, which did not set it)"
    )


def make_schedule(config: OptimConfig) -> optax.Schedule:
  """Returns ``count -> lr`` (count = updates already applied since init; scalar int32)."""
  _check_schedule(config)
  peak = config.lr
  warm = config.warmup_steps

  def schedule(count):
    count = jnp.asarray(count, jnp.float32)
    warm_factor = jnp.minimum(1.0, (count + 1.0) / warm) if warm > 0 else jnp.float32(1.0)
    if config.schedule == "constant":
      return peak * warm_factor
    decay_steps = config.total_steps - warm
    # Progress through the decay phase; the first post-warm-up update is at progress 0.
    progress = jnp.clip((count - warm + 1.0) / decay_steps, 0.0, 1.0)
    cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    decayed = peak * (config.final_lr_ratio + (1.0 - config.final_lr_ratio) * cosine)
    return jnp.where(count < warm, peak * warm_factor, decayed)

  return schedule


def make_optimizer(config: OptimConfig) -> optax.GradientTransformation:
  """clip_by_global_norm -> AdamW(schedule). The AdamW count drives the schedule."""
  parts = []
  if config.grad_clip:
    parts.append(optax.clip_by_global_norm(config.grad_clip))
  parts.append(
    optax.adamw(
      learning_rate=make_schedule(config),
      b1=config.b1,
      b2=config.b2,
      eps=config.eps,
      weight_decay=config.weight_decay,
    )
  )
  return optax.chain(*parts)


def optimizer_update_count(opt_state) -> jax.Array:
  """Updates applied since the optimizer was initialised (what the schedule sees); int32 []."""
  kinds = (optax.ScaleByScheduleState, optax.ScaleByAdamState)
  found = [
    x
    for x in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, kinds))
    if isinstance(x, kinds)
  ]
  for kind in kinds:  # the schedule's own counter first
    for x in found:
      if isinstance(x, kind):
        return x.count
  raise ValueError(
    "optimizer_update_count: no optax schedule/Adam state with a count in the "
    "optimizer state; was it built by make_optimizer?"
  )


def current_learning_rate(config: OptimConfig, opt_state) -> jax.Array:
  """The lr the NEXT update will use; float32 []."""
  return make_schedule(config)(optimizer_update_count(opt_state))
