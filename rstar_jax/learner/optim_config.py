"""The optimizer's settings, `OptimConfig`: defined here, where the learner reads it
(`rstar_jax.learner.optim` builds the optax chain from it), and imported by the run config as
its ``optim`` / ``sft_optim`` sections (`rstar_jax.config.schema`), not the reverse.

jax-free on purpose: the config (and so ``--help`` / ``--describe_config``) imports this module.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from rstar_jax.config_fields import Section, field, int_range, num_range, one_of, section

SCHEDULES = ("constant", "cosine")


@section
class OptimConfig(Section):
  """AdamW with warm-up then a constant or cosine schedule (rStar2-Agent RL: lr 1e-6 constant after 20 warm-up steps, weight decay 0.01, grad clip 1.0). The one optimizer config: `rstar_jax.learner.optim` builds the optax chain from it."""

  SECTION: ClassVar[str] = "optim"
  lr: float = field(1e-6, num_range(0, lo_open=True), "Peak learning rate (rStar2-Agent RL: 1e-6).")
  warmup_steps: int = field(20, int_range(0), "Linear warm-up steps (rStar2-Agent RL: 20).")
  schedule: str = field(
    "constant", one_of(SCHEDULES), "'constant' or 'cosine' (decays over total_steps)."
  )
  total_steps: int = field(
    0, int_range(0), "Schedule length for 'cosine' (0 = set by the loop, e.g. SFT)."
  )
  final_lr_ratio: float = field(
    0.0, num_range(0, 1), "'cosine': the end value as a fraction of the peak lr."
  )
  b1: float = field(0.9, num_range(0, 1, hi_open=True), "Adam beta1.")
  b2: float = field(0.999, num_range(0, 1, hi_open=True), "Adam beta2.")
  eps: float = field(1e-8, num_range(0, lo_open=True), "Adam epsilon.")
  weight_decay: float = field(0.01, num_range(0), "Decoupled weight decay (rStar2-Agent: 0.01).")
  grad_clip: float = field(
    1.0, num_range(0), "Global-norm gradient clip (0 = off; rStar2-Agent: 1.0)."
  )

  def _cross(self):
    if self.schedule == "cosine" and 0 < self.total_steps <= self.warmup_steps:
      return [
        (
          "optim.total_steps",
          f"expected > warmup_steps ({self.warmup_steps}) for a cosine schedule, "
          f"got {self.total_steps}",
        )
      ]
    return []

  def learner_config(self, total_steps: int | None = None) -> OptimConfig:
    """This config with the schedule length the loop decided (``total_steps``; None keeps
    the field)."""
    if total_steps is None:
      return self
    return dataclasses.replace(self, total_steps=int(total_steps))
