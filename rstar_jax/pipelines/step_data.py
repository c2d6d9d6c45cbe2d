"""What the RL step's stages hand each other (`Rollouts` -> `Scores` -> `Selected`), and the
pure functions between them: the penalties, the selection with its kept trajectories, and the
step's trajectory / group / selection statistics. `rl_loop.RLLoop` sequences them."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from rstar_jax.config import RLConfig
from rstar_jax.data.problems import Problem
from rstar_jax.pipelines import rl_metrics
from rstar_jax.rewards import quality
from rstar_jax.rl import selection as selection_lib


@dataclasses.dataclass
class Rollouts:
  """Output of the rollout stage: ``groups[i][j]`` is sample j of ``problems[i]`` (each
  `Trajectory` records the weight version of every token)."""

  problems: list[Problem]
  groups: list[list[Any]]
  seed0: int
  select_key: jax.Array
  retries: int
  time_s: float
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)  # the source's own
  generated: int = 0  # trajectories generated this step, summed over processes
  ids: list[tuple[int, int]] | None = None  # per group (seq, seed): `groups.Groups.ids`


@dataclasses.dataclass
class Scores:
  """Output of the score stage: [P, N] float32 host arrays."""

  rewards: np.ndarray
  penalties: np.ndarray
  time_s: float


@dataclasses.dataclass
class Selected:
  """Output of the select stage: the pure selection (host arrays) and the kept trajectories
  in batch order (group-major, kept index ascending)."""

  selection: selection_lib.Selection
  trajectories: list[Any]
  advantages: list[float]
  rewards: list[float]


def penalties_of(trajectories: Sequence[Any], p_err_mode: str, p_format_mode: str) -> np.ndarray:
  """p_err + p_format per trajectory, float32 [len(trajectories)]."""
  return np.asarray(
    [
      quality.p_err(
        [c.status for c in t.tool_calls], p_err_mode, [c.output_text for c in t.tool_calls]
      )
      + quality.p_format(t.response_text, max(1, t.num_turns), p_format_mode)
      for t in trajectories
    ],
    np.float32,
  )


def select(ro: Rollouts, scores: Scores, rl: RLConfig) -> Selected:
  """`rl.selection.select_rollouts` with the ``rl`` section's settings; the kept trajectories."""
  sel = selection_lib.select_rollouts(
    ro.select_key,
    scores.rewards,
    scores.penalties,
    group_size=rl.group_size,
    mode=rl.roc_mode,
    min_pos=rl.min_pos,
    min_neg=rl.min_neg,
    roc_eps=rl.roc_eps,
    drop_zero_variance=rl.drop_zero_variance,
    advantage=rl.advantage,
    adv_eps=rl.adv_eps,
    unbiased_std=rl.unbiased_std,
    neg_adv_scale=rl.neg_adv_scale,
  )
  sel = selection_lib.Selection(*(np.asarray(x) for x in sel))
  trajs, adv, rewards = [], [], []
  for g in np.flatnonzero(sel.keep_group):
    for j, col in enumerate(sel.indices[g]):
      trajs.append(ro.groups[g][col])
      adv.append(float(sel.advantages[g, j]))
      rewards.append(float(sel.rewards[g, j]))
  return Selected(sel, trajs, adv, rewards)


def selection_metrics(ro: Rollouts, scores: Scores, sel: Selected) -> dict[str, Any]:
  """Trajectory, group-outcome, tool and selection statistics of one step's groups."""
  flat = rl_metrics.flatten(ro.groups)
  r = scores.rewards
  metrics: dict[str, Any] = {
    "rollout_retries": float(ro.retries),
    "rollouts_generated": float(ro.generated),  # summed over processes
    "groups_kept": float(sel.selection.keep_group.sum()),
    "groups_total": float(len(ro.problems)),
  }
  metrics.update(rl_metrics.group_outcome_metrics(r))
  metrics.update(rl_metrics.trajectory_metrics(flat, r.reshape(-1)))
  metrics.update(rl_metrics.trajectory_metrics(sel.trajectories, sel.rewards, prefix="kept_"))
  metrics.update(rl_metrics.tool_latency_metrics(flat))
  metrics["penalty_pos_mean"] = float(scores.penalties[r > 0].mean()) if (r > 0).any() else 0.0
  return metrics
