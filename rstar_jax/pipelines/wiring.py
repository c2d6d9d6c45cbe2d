"""Builds the run's parts from a typed `RunConfig` (config -> group source, ...).

The one place a config section becomes an object: the loops take the objects and never read the
config to decide how a part is built.
"""

from __future__ import annotations

from rstar_jax.config import RunConfig
from rstar_jax.rollout.async_source import AsyncSource
from rstar_jax.rollout.sources import GroupSource, SyncSource


def group_source(run: RunConfig, runner, *, on_start=None) -> GroupSource:
  """The RL loop's group source: `SyncSource` at ``rl.max_staleness = 0``, else `AsyncSource`
  (``on_start``: the synchronous source's progress ticker factory)."""
  rl = run.rl
  n = rl.oversample * rl.group_size
  if rl.max_staleness == 0:
    return SyncSource(runner, num_samples=n, max_retries=rl.max_step_retries, on_start=on_start)
  return AsyncSource(
    runner,
    max_staleness=rl.max_staleness,
    partial_rollout=rl.partial_rollout,
    num_samples=n,
    batch_prompts=run.train.batch_prompts,
    base_seed=run.train.seed,
    max_retries=rl.max_step_retries,
  )
