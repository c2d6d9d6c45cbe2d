"""Host-side statistics of a step's trajectories (the paper's and ASTER's monitoring signals).

All functions take plain Python/numpy data and return ``{name: float}`` dicts, so they can be
unit-tested without a model and logged as they are.

Interaction collapse (ASTER): `CollapseMonitor` warns when the mean number of tool calls per
trajectory has fallen for ``window`` consecutive steps (each step's value below the previous
one, compared on a smoothed series) and ends at most ``ratio`` of its value at the start of
the window.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# Tool outcomes counted as errors (code pool statuses, session_lost included, + the agent
# loop's JSON parse failure).
FAILURE_STATUSES = frozenset(
  {
    "error",
    "timeout",
    "memory_limit",
    "output_limit",
    "internal_error",
    "session_lost",
    "parse_error",
  }
)

# Trajectory finish reasons that mean "ran out of response budget" (the paper's clip ratio).
TRUNCATED = frozenset({"length", "tool_overflow"})


def _mean(xs) -> float:
  xs = list(xs)
  return float(np.mean(xs)) if xs else 0.0


def tool_error_ratio(traj: Any) -> float | None:
  """Error calls / all calls of one trajectory; None when it made no call."""
  calls = list(getattr(traj, "tool_calls", ()) or ())
  if not calls:
    return None
  return sum(1 for c in calls if c.status in FAILURE_STATUSES) / len(calls)


def trajectory_metrics(
  trajs: Sequence[Any], rewards: Sequence[float], prefix: str = ""
) -> dict[str, float]:
  """Statistics over one set of trajectories (all sampled, or only the ones kept by RoC).

  Keys (with ``prefix``): reward_mean, response_length_mean, truncation_ratio, turns_per_traj,
  tool_calls_per_traj, tool_error_ratio (all calls), pos_tool_error_ratio (calls of the
  positive trajectories: the paper's Fig. 4 metric), pos_no_tool_frac, answer_tags_mean,
  answer_tags_eq1_frac, answer_tags_0_frac, answer_tags_ge2_frac, num_trajectories; and
  prefill_tokens_per_traj (input tokens the engine computed, cache hits excluded) when the engine
  reported it for every trajectory.
  """
  rewards = [float(r) for r in rewards]
  n = len(trajs)
  if n != len(rewards):
    raise ValueError(f"trajectory_metrics: {n} trajectories but {len(rewards)} rewards")
  p = prefix
  if n == 0:
    return {f"{p}num_trajectories": 0.0}
  calls = [list(t.tool_calls) for t in trajs]
  all_calls = [c for cs in calls for c in cs]
  pos_calls = [c for cs, r in zip(calls, rewards) if r > 0 for c in cs]
  tags = [int(getattr(t, "num_answer_tags", 0)) for t in trajs]
  n_pos = sum(1 for r in rewards if r > 0)
  prefill = [getattr(t, "prefill_tokens", None) for t in trajs]
  out = {} if None in prefill else {f"{p}prefill_tokens_per_traj": _mean(prefill)}
  return out | {
    f"{p}num_trajectories": float(n),
    f"{p}reward_mean": _mean(rewards),
    f"{p}response_length_mean": _mean(len(t.response_ids) for t in trajs),
    f"{p}generated_tokens_mean": _mean(float(np.sum(t.loss_mask)) for t in trajs),
    f"{p}truncation_ratio": _mean(float(t.finish_reason in TRUNCATED) for t in trajs),
    f"{p}max_turns_frac": _mean(float(t.finish_reason == "max_turns") for t in trajs),
    f"{p}turns_per_traj": _mean(t.num_turns for t in trajs),
    f"{p}tool_calls_per_traj": _mean(len(cs) for cs in calls),
    f"{p}tool_error_ratio": (sum(c.status in FAILURE_STATUSES for c in all_calls) / len(all_calls))
    if all_calls
    else 0.0,
    f"{p}pos_tool_error_ratio": (
      sum(c.status in FAILURE_STATUSES for c in pos_calls) / len(pos_calls)
    )
    if pos_calls
    else 0.0,
    f"{p}pos_no_tool_frac": (sum(1 for cs, r in zip(calls, rewards) if r > 0 and not cs) / n_pos)
    if n_pos
    else 0.0,
    f"{p}answer_tags_mean": _mean(tags),
    f"{p}answer_tags_0_frac": _mean(float(k == 0) for k in tags),
    f"{p}answer_tags_eq1_frac": _mean(float(k == 1) for k in tags),
    f"{p}answer_tags_ge2_frac": _mean(float(k >= 2) for k in tags),
  }


def tool_latency_metrics(trajs: Sequence[Any]) -> dict[str, float]:
  """Tool-call count and latency (mean, p50, p90, max) over the step's calls, plus status mix."""
  durs = [float(c.duration_s) for t in trajs for c in t.tool_calls]
  statuses = collections.Counter(c.status for t in trajs for c in t.tool_calls)
  out = {"tool_calls_total": float(len(durs))}
  if durs:
    out.update(
      tool_latency_mean_s=float(np.mean(durs)),
      tool_latency_p50_s=float(np.percentile(durs, 50)),
      tool_latency_p90_s=float(np.percentile(durs, 90)),
      tool_latency_max_s=float(np.max(durs)),
    )
  for s, k in statuses.items():
    out[f"tool_status_{s}_frac"] = k / len(durs)
  return out


def group_outcome_metrics(rewards: np.ndarray) -> dict[str, float]:
  """Zero-variance statistics of ``rewards`` [P, n] (one row per prompt).

  all_correct_frac / all_wrong_frac: share of groups whose n rewards are all > 0 / all 0 (the
  groups the zero-variance filter removes); mixed_frac = the rest; pass_rate = mean reward.
  """
  r = np.asarray(rewards, np.float32)
  if r.ndim != 2 or r.shape[0] == 0:
    return {"all_correct_frac": 0.0, "all_wrong_frac": 0.0, "mixed_frac": 0.0}
  pos = r > 0
  all_c = pos.all(axis=1)
  all_w = (~pos).all(axis=1)
  return {
    "all_correct_frac": float(all_c.mean()),
    "all_wrong_frac": float(all_w.mean()),
    "mixed_frac": float((~all_c & ~all_w).mean()),
    "pass_rate": float(r.mean()),
  }


class CollapseMonitor:
  """Watches tool calls per trajectory across RL steps (ASTER's interaction collapse).

  Args:
    window: number of consecutive decreases (of the smoothed series) that raise a warning.
    ratio: the warning also needs the last value <= ratio * the value ``window`` steps ago.
    smoothing: EMA factor in [0, 1) applied before comparing (0 = raw values).
  """

  def __init__(self, window: int = 5, ratio: float = 0.8, smoothing: float = 0.0):
    if window < 1:
      raise ValueError(f"CollapseMonitor window: expected >= 1, got {window}")
    if not 0.0 <= smoothing < 1.0:
      raise ValueError(f"CollapseMonitor smoothing: expected in [0, 1), got {smoothing}")
    self.window, self.ratio, self.smoothing = window, ratio, smoothing
    self.history: list[float] = []

  def update(self, tool_calls_per_traj: float) -> bool:
    """Adds one step's value; returns True (and logs a warning) when collapse is suspected."""
    x = float(tool_calls_per_traj)
    if self.history and self.smoothing:
      x = self.smoothing * self.history[-1] + (1.0 - self.smoothing) * x
    self.history.append(x)
    if len(self.history) <= self.window:
      return False
    recent = self.history[-(self.window + 1) :]
    falling = all(b < a for a, b in zip(recent, recent[1:]))
    if falling and recent[-1] <= self.ratio * recent[0]:
      log.warning(
        "interaction collapse suspected: tool calls per trajectory fell for %d steps "
        "in a row (%.2f -> %.2f)",
        self.window,
        recent[0],
        recent[-1],
      )
      return True
    return False

  def state_dict(self) -> dict:
    return {"history": list(self.history)}

  def load_state_dict(self, state: dict) -> None:
    self.history = [float(x) for x in state.get("history", [])]


def flatten(groups: Iterable[Sequence[Any]]) -> list[Any]:
  return [x for g in groups for x in g]
