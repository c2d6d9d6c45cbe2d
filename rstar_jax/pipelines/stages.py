"""The multi-stage RL recipe: stage records and the hard subset (rStar2-Agent stage 3, ASTER stage 2).

rStar2-Agent stage 3 trains on the problems left after dropping those the policy at the stage
start solves k of k times (k = 8 rollouts per problem); ASTER stage 2 drops prompts that are
consistently solved. `build_hard_subset` is the pure selection; the RL loop produces the counts
by sampling k rollouts per problem with the current policy.
"""
from __future__ import annotations

from typing import Sequence, TypeVar

import numpy as np

from rstar_jax.config import StageConfig

T = TypeVar("T")


# One RL stage: the typed config's `StageConfig` (name, steps, response_budget, max_turns,
# data "full" | "hard", reset_optimizer, drop_solved_k_of_k).
Stage = StageConfig


def locate(stages: Sequence[Stage], global_step: int) -> tuple[int, int]:
  """(stage index, steps already done in it) for a run that has done ``global_step`` steps.

  ``global_step`` equal to the total returns (len(stages), 0): the run is finished.
  """
  done = global_step
  for i, st in enumerate(stages):
    if done < st.steps:
      return i, done
    done -= st.steps
  return len(stages), 0


def build_hard_subset(problems: Sequence[T], num_correct: Sequence[int], k: int,
                      num_sampled: Sequence[int] | None = None) -> tuple[list[T], dict]:
  """Drops problems solved k of k; returns (kept problems in order, stats).

  Args:
    problems: the candidate problems.
    num_correct: [P] correct rollouts per problem.
    k: rollouts sampled per problem (solved k of k = always solved).
    num_sampled: [P] rollouts actually sampled per problem (default k each). A problem with
      fewer than k samples is kept: it was not shown to be always solved.
  Returns:
    kept: problems with num_correct < k (or fewer than k samples).
    stats: {"hard_subset_candidates", "hard_subset_kept", "hard_subset_dropped",
            "hard_subset_kept_frac"}.
  """
  if k < 1:
    raise ValueError(f"build_hard_subset: k must be >= 1, got {k}")
  correct = np.asarray(num_correct, np.int64)
  sampled = np.full(len(problems), k, np.int64) if num_sampled is None else \
      np.asarray(num_sampled, np.int64)
  if correct.shape != (len(problems),) or sampled.shape != (len(problems),):
    raise ValueError(f"build_hard_subset: num_correct {correct.shape} / num_sampled "
                     f"{sampled.shape} must have shape ({len(problems)},)")
  if np.any(correct < 0) or np.any(correct > sampled):
    raise ValueError("build_hard_subset: num_correct must be in [0, num_sampled]")
  always = (sampled >= k) & (correct >= sampled)
  kept = [p for p, a in zip(problems, always) if not a]
  n = len(problems)
  stats = {"hard_subset_candidates": n, "hard_subset_kept": len(kept),
           "hard_subset_dropped": n - len(kept),
           "hard_subset_kept_frac": len(kept) / n if n else 0.0}
  return kept, stats
