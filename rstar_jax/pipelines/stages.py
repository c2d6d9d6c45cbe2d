"""The multi-stage RL recipe: stage records and the hard subsets (rStar2-Agent stage 3, ASTER stage 2; docs/fidelity.md).

rStar2-Agent stage 3 trains on the problems left after dropping those the policy at the stage
start solves k of k times (k = 8 rollouts per problem); ASTER stage 2 drops prompts that are
consistently solved. `build_hard_subset` is the pure selection; `hard_subset` produces the
counts by sampling k rollouts per problem with the current policy (a `SyncSource`), and
`recent_subset` reads the loop's recorded outcomes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from rstar_jax.config import StageConfig
from rstar_jax.pipelines import rl_metrics

log = logging.getLogger(__name__)

T = TypeVar("T")


# One RL stage: the typed config's `StageConfig` (name, steps, response_budget, max_turns,
# data "full" | "hard" | "recent", reset_optimizer, drop_solved_k_of_k, recent_steps).
# "hard": the subset built at the stage start by re-sampling k rollouts per problem
# (rStar2-Agent stage 3); "recent": the problems not all-correct the last time they were
# trained on within the previous ``recent_steps`` RL steps (ASTER stage 2, no re-sampling).
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


def build_hard_subset(
  problems: Sequence[T],
  num_correct: Sequence[int],
  k: int,
  num_sampled: Sequence[int] | None = None,
) -> tuple[list[T], dict]:
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
  sampled = (
    np.full(len(problems), k, np.int64)
    if num_sampled is None
    else np.asarray(num_sampled, np.int64)
  )
  if correct.shape != (len(problems),) or sampled.shape != (len(problems),):
    raise ValueError(
      f"build_hard_subset: num_correct {correct.shape} / num_sampled "
      f"{sampled.shape} must have shape ({len(problems)},)"
    )
  if np.any(correct < 0) or np.any(correct > sampled):
    raise ValueError("build_hard_subset: num_correct must be in [0, num_sampled]")
  always = (sampled >= k) & (correct >= sampled)
  kept = [p for p, a in zip(problems, always) if not a]
  n = len(problems)
  stats = {
    "hard_subset_candidates": n,
    "hard_subset_kept": len(kept),
    "hard_subset_dropped": n - len(kept),
    "hard_subset_kept_frac": len(kept) / n if n else 0.0,
  }
  return kept, stats


def recent_unsolved_subset(
  num_problems: int, history: Sequence[Sequence[Sequence[Any]]]
) -> tuple[list[int], dict[str, int]]:
  """Indices of the problems NOT all-correct at their latest appearance in ``history``.

  ASTER's stage-2 filter: the training rollouts of the last stage-1 steps decide; a problem
  whose group was all correct the last time it was sampled is dropped, every other problem
  (including ones not sampled in the window) is kept.

  Args:
    num_problems: size of the training set (indices 0..num_problems-1).
    history: oldest first, one entry per RL step: [(problem_index, all_correct), ...].
  Returns:
    (kept indices in order, stats: recent_window_steps, recent_seen, recent_dropped).
  """
  latest: dict[int, bool] = {}
  for step in history:
    for i, all_correct in step:
      if not 0 <= int(i) < num_problems:
        raise ValueError(f"recent_unsolved_subset: problem index {i} outside [0, {num_problems})")
      latest[int(i)] = bool(all_correct)
  dropped = {i for i, ok in latest.items() if ok}
  kept = [i for i in range(num_problems) if i not in dropped]
  return kept, {
    "recent_window_steps": len(history),
    "recent_seen": len(latest),
    "recent_dropped": len(dropped),
  }


async def hard_subset(
  problems: Sequence[Any],
  stage: Stage,
  source,
  verify: Callable[[list[Any], list[str]], Awaitable[list[float]]],
  *,
  seed: int,
  settings,
  max_problems: int = 0,
) -> tuple[list[int], dict]:
  """Indices of the training problems the current policy does not solve k of k.

  Args:
    problems: the training set.
    stage: the "hard" stage (its name names it in errors).
    source: a `rollout.sources.SyncSource` with ``k = stage.drop_solved_k_of_k`` samples per
      problem (the current policy).
    verify: (trajectories, answers) -> rewards (the loop's multi-process verification).
    seed: the groups' base seed.
    settings: the stage's rollout settings.
    max_problems: sample only the first this many problems (0 = all); the rest are kept.
  Returns:
    (kept indices, `build_hard_subset` stats).
  """
  k = source.N
  cand = list(range(min(max_problems or len(problems), len(problems))))
  made = await source.groups_of([problems[i] for i in cand], seed=seed, settings=settings)
  rewards = await verify(
    rl_metrics.flatten(made.groups), [problems[i].answer for i in cand for _ in range(k)]
  )
  correct = np.asarray(rewards, np.float32).reshape(len(cand), k) > 0
  kept, stats = build_hard_subset(cand, correct.sum(1), k)
  kept += list(range(len(cand), len(problems)))  # never sampled: kept
  if not kept:
    raise RuntimeError(
      f"stage {stage.name!r}: every problem was solved {k} of {k}; the hard subset is empty"
    )
  log.info(
    "hard subset for %r: kept %d of %d candidates",
    stage.name,
    stats["hard_subset_kept"],
    stats["hard_subset_candidates"],
  )
  return kept, stats


def recent_subset(
  num_problems: int, stage: Stage, recent_outcomes: Sequence[Any] | None
) -> tuple[list[int], dict]:
  """The problems not all-correct at their latest appearance in the last
  ``stage.recent_steps`` RL steps' training rollouts (`recent_unsolved_subset`)."""
  history = list(recent_outcomes or [])[-stage.recent_steps :]
  kept, stats = recent_unsolved_subset(num_problems, history)
  if not kept:
    raise RuntimeError(
      f"stage {stage.name!r}: every problem was all-correct in the recent "
      "rollouts; the subset is empty"
    )
  log.info(
    "recent-rollout subset for %r: dropped %d of %d seen problems",
    stage.name,
    stats["recent_dropped"],
    stats["recent_seen"],
  )
  return kept, stats
