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

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
  """AdamW + clipping + schedule. Frozen and hashable.

  Attributes:
      learning_rate: peak learning rate (after warm-up).
      b1, b2, eps: Adam moments' decay rates and epsilon.
      weight_decay: decoupled (AdamW) weight decay, applied to every parameter (as
          torch's AdamW in verl does).
      grad_clip_norm: clip gradients to this global L2 norm before Adam; None disables clipping.
      warmup_steps: number of linearly warmed-up updates; 0 means start at the peak.
      schedule: "constant" (hold the peak) or "cosine" (decay from the peak to
          ``learning_rate * final_lr_ratio`` at ``total_steps``, then hold).
      total_steps: total optimizer updates, warm-up included; required for "cosine".
      final_lr_ratio: cosine end value as a fraction of the peak.
  """

  learning_rate: float = 1e-6
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.01
  grad_clip_norm: float | None = 1.0
  warmup_steps: int = 20
  schedule: Literal["constant", "cosine"] = "constant"
  total_steps: int | None = None
  final_lr_ratio: float = 0.0

  def __post_init__(self):
    def bad(field, expected, got):
      raise ValueError(f"OptimConfig.{field}: expected {expected}, got {got!r}")

    if not self.learning_rate > 0:
      bad("learning_rate", "> 0", self.learning_rate)
    for name in ("b1", "b2"):
      v = getattr(self, name)
      if not 0.0 <= v < 1.0:
        bad(name, "in [0, 1)", v)
    if not self.eps > 0:
      bad("eps", "> 0", self.eps)
    if self.weight_decay < 0:
      bad("weight_decay", ">= 0", self.weight_decay)
    if self.grad_clip_norm is not None and not self.grad_clip_norm > 0:
      bad("grad_clip_norm", "> 0 or None", self.grad_clip_norm)
    if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
      bad("warmup_steps", "an int >= 0", self.warmup_steps)
    if self.schedule not in SCHEDULES:
      bad("schedule", f"one of {SCHEDULES}", self.schedule)
    if self.schedule == "cosine":
      if self.total_steps is None or self.total_steps <= self.warmup_steps:
        bad(
          "total_steps",
          f"an int > warmup_steps ({self.warmup_steps}) for a cosine schedule",
          self.total_steps,
        )
    if not 0.0 <= self.final_lr_ratio <= 1.0:
      bad("final_lr_ratio", "in [0, 1]", self.final_lr_ratio)


def make_schedule(config: OptimConfig) -> optax.Schedule:
  """Returns ``count -> lr`` (count = updates already applied since init; scalar int32)."""
  peak = config.learning_rate
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
  if config.grad_clip_norm is not None:
    parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
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
