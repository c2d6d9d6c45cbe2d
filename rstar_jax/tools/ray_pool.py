"""Scale-out: one CodePool actor per Ray node behind the CodePool interface.

    ray.init(...)
    async with RayCodePool(PoolConfig(num_workers=64)) as pool:
        r = await pool.execute("print(1)")

Calls are spread round-robin over the node actors; a session stays on the actor that started it.
Ray is an optional dependency (`pip install rstar_jax[ray]`): importing this module without it
works, starting the pool raises ImportError.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from rstar_jax.tools.code_pool import (
  ISOLATION_LEVELS,
  BatchExecuteMixin,
  CodePool,
  ExecResult,
  FunctionRunError,
  PoolConfig,
)


class _PoolActor:
  """Runs on one node; owns that node's CodePool."""

  def __init__(self, config: PoolConfig):
    self.config = config
    self.pool: CodePool | None = None

  async def start(self) -> dict:
    import ray  # noqa: F401  (actor side)

    self.pool = CodePool(config=self.config)
    await self.pool.start()
    import socket

    return {"isolation_level": self.pool.isolation_level, "host": socket.gethostname()}

  async def execute(self, code, stdin, timeout_s, session_id) -> ExecResult:
    return await self.pool.execute(code, stdin, timeout_s, session_id)

  async def close_session(self, session_id) -> bool:
    return await self.pool.close_session(session_id)

  async def run_function(self, fn, args, kwargs, timeout_s):
    try:
      return True, await self.pool.run_function(fn, *args, timeout_s=timeout_s, **kwargs)
    except FunctionRunError as e:
      return False, (e.status, e.detail)

  async def close(self) -> None:
    if self.pool is not None:
      await self.pool.close()


class RayCodePool(BatchExecuteMixin):
  """CodePool interface over one `_PoolActor` per alive Ray node (ray must be initialised)."""

  def __init__(
    self,
    config: PoolConfig | None = None,
    *,
    max_concurrency: int = 4096,
    actor_num_cpus: float = 0.0,
  ):
    self.config = config or PoolConfig()
    self.max_concurrency = max_concurrency
    self.actor_num_cpus = actor_num_cpus
    self.actors: list = []
    self.node_info: list[dict] = []
    self._rr = itertools.count()
    self._sessions: dict[str, Any] = {}

  @property
  def isolation_level(self) -> str | None:
    """The weakest level over the nodes (what the whole pool can promise)."""
    levels = [i["isolation_level"] for i in self.node_info]
    return max(levels, key=ISOLATION_LEVELS.index) if levels else None

  async def start(self) -> RayCodePool:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
      raise RuntimeError("RayCodePool needs ray.init() (or a running cluster) first")
    actor_cls = ray.remote(_PoolActor)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    for node in nodes:
      self.actors.append(
        actor_cls.options(
          max_concurrency=self.max_concurrency,
          num_cpus=self.actor_num_cpus,
          scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
        ).remote(self.config)
      )
    self.node_info = list(await asyncio.gather(*(a.start.remote() for a in self.actors)))
    return self

  async def close(self) -> None:
    import ray

    await asyncio.gather(*(a.close.remote() for a in self.actors), return_exceptions=True)
    for a in self.actors:
      ray.kill(a)
    self.actors = []

  async def __aenter__(self):
    return await self.start()

  async def __aexit__(self, *exc):
    await self.close()

  def _next(self):
    if not self.actors:
      raise RuntimeError("RayCodePool is not running: use `async with RayCodePool(...)`")
    return self.actors[next(self._rr) % len(self.actors)]

  async def execute(
    self,
    code: str,
    stdin: str = "",
    timeout_s: float | None = None,
    session_id: str | None = None,
  ) -> ExecResult:
    if session_id is None:
      actor = self._next()
    else:
      actor = self._sessions.setdefault(str(session_id), None) or self._next()
      self._sessions[str(session_id)] = actor
    return await actor.execute.remote(code, stdin, timeout_s, session_id)

  async def close_session(self, session_id: str) -> bool:
    actor = self._sessions.pop(str(session_id), None)
    return False if actor is None else await actor.close_session.remote(str(session_id))

  async def run_function(self, fn: Callable, *args, timeout_s: float = 5.0, **kwargs) -> Any:
    ok, value = await self._next().run_function.remote(fn, args, kwargs, timeout_s)
    if not ok:
      raise FunctionRunError(*value)
    return value
