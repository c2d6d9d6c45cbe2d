"""Transient tool failures injected at a set rate (a noisy environment, issue 30).

rStar2-Agent's Resample-on-Correct exists because real code environments fail in ways that
have nothing to do with the answer; a clean local sandbox almost never does. `NoisyPool` wraps
any code pool (``execute(code, stdin, timeout_s, session_id) -> ExecResult``) and makes a
share ``rate`` of the calls fail without running them, as a failure the policy sees in its
tool response (status "error", a transient-failure message in stderr). Status "error" and not
"internal_error": the RL loop retries rollouts whose pool lost a worker, and these failures
must reach the policy instead.

Which calls fail is decided per trajectory: `for_trajectory(pool, seed)` gives the agent loop
a view whose random stream is seeded by (``seed`` of the wrapper, the trajectory's seed), and
the n-th call of a trajectory draws the n-th number of that stream. The same trajectory seed
therefore fails the same calls whatever else runs concurrently, and different trajectories of
one group fail independently. ``rate`` 0 (the default, ``tool.inject_failure_rate``) builds no
wrapper at all.
"""

from __future__ import annotations

import random
from typing import Any

from rstar_jax.tools.code_pool import ExecResult

TRANSIENT_STDERR = "OSError: the sandbox was temporarily unavailable; the code did not run"


class NoisyPool:
  """``pool`` with a share ``rate`` of its calls failing transiently (module docstring).

  Calls made on the wrapper itself (not through `for_trajectory`) draw from one stream seeded
  by ``seed`` (deterministic only in call order). Everything but ``execute`` is the pool's.
  """

  def __init__(self, pool, rate: float, seed: int = 0):
    if isinstance(rate, bool) or not 0.0 <= float(rate) <= 1.0:
      raise ValueError(f"tool.inject_failure_rate: expected a probability in [0, 1], got {rate!r}")
    self.pool, self.rate, self.seed = pool, float(rate), int(seed)
    self._rng = random.Random(f"tool-noise:{self.seed}")

  def __getattr__(self, name: str) -> Any:  # start, close, close_session, stats, ...
    return getattr(self.pool, name)

  async def execute(self, code: str, stdin: str = "", timeout_s=None, session_id=None):
    return await _execute(self.pool, self.rate, self._rng, code, stdin, timeout_s, session_id)

  def trajectory_view(self, trajectory_seed: int) -> _TrajectoryView:
    return _TrajectoryView(self, random.Random(f"tool-noise:{self.seed}:{int(trajectory_seed)}"))


class _TrajectoryView:
  """One trajectory's calls on a `NoisyPool`: its own random stream."""

  def __init__(self, noisy: NoisyPool, rng: random.Random):
    self._noisy, self._rng = noisy, rng

  def __getattr__(self, name: str) -> Any:
    return getattr(self._noisy.pool, name)

  async def execute(self, code: str, stdin: str = "", timeout_s=None, session_id=None):
    n = self._noisy
    return await _execute(n.pool, n.rate, self._rng, code, stdin, timeout_s, session_id)


async def _execute(pool, rate, rng, code, stdin, timeout_s, session_id) -> ExecResult:
  # Drawn before the await, so the calls of one turn (started in order) keep their draws.
  if rng.random() < rate:
    return ExecResult(status="error", stderr=TRANSIENT_STDERR, duration_s=0.0, exit_code=None)
  return await pool.execute(code, stdin, timeout_s, session_id)


def wrap(pool, tool_config):
  """``pool`` wrapped by a `NoisyPool` when ``tool_config.inject_failure_rate`` > 0, else
  ``pool`` itself (the hook where the agent runner builds its pool)."""
  rate = float(getattr(tool_config, "inject_failure_rate", 0.0) or 0.0)
  if rate == 0.0:
    return pool
  return NoisyPool(pool, rate, int(getattr(tool_config, "inject_seed", 0)))


def for_trajectory(pool, trajectory_seed: int):
  """The pool one trajectory calls: a per-trajectory view of a `NoisyPool`, else ``pool``."""
  if isinstance(pool, NoisyPool):
    return pool.trajectory_view(trajectory_seed)
  return pool
