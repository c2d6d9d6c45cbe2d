"""Rollout: engines (JaxSampler embedded, SGLangEngine over HTTP), the async agent loop, and
trajectory groups: `groups` (how a group is made: seeds, retries, multi-process gather) and
their sources (`sources.SyncSource`, `async_source.AsyncSource`) that the RL loop takes from.

Engines are imported lazily so that importing the types does not pull in jax or aiohttp.
"""

from rstar_jax.rollout.types import (
  Engine,
  GenerateRequest,
  GenerateResult,
  SamplingParams,
  ToolCallRecord,
  Trajectory,
)

_LAZY = {
  "JaxSampler": "rstar_jax.rollout.jax_sampler",
  "SGLangEngine": "rstar_jax.rollout.sglang_engine",
  "RolloutSettings": "rstar_jax.rollout.agent_loop",
  "run_trajectory": "rstar_jax.rollout.agent_loop",
  "run_agent_loop": "rstar_jax.rollout.agent_loop",
  "KVCapacityScheduler": "rstar_jax.rollout.scheduler",
}

__all__ = [
  "Engine",
  "GenerateRequest",
  "GenerateResult",
  "SamplingParams",
  "ToolCallRecord",
  "Trajectory",
  *_LAZY,
]


def __getattr__(name):
  if name in _LAZY:
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'rstar_jax.rollout' has no attribute {name!r}")
