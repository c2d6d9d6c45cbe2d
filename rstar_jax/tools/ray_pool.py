"""Scale-out: one CodePool actor per Ray node behind the CodePool interface.

    ray.init(...)
    async with RayCodePool(PoolConfig(num_workers=64)) as pool:
        r = await pool.execute("print(1)")

Calls are spread round-robin over the node actors; a session stays on the actor that started it.
An actor that dies (its process killed, its node lost) is replaced by a fresh one on the same
node (dropped when the node is gone), and the stateless calls it was running (execute without a
session, run_function) are re-sent to another actor. A session call whose actor died returns
status `session_lost` (never re-run on a fresh session); the next call on that id starts a fresh
session whose stdout opens with a note saying so.
Ray is an optional dependency (`pip install rstar_jax[ray]`): importing this module without it
works, starting the pool raises ImportError.
"""

from __future__ import annotations

import asyncio
import dataclasses
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
    self._lost: set[str] = set()
    self._node_of: dict[Any, str] = {}
    self._replacing: asyncio.Lock | None = None
    self._actor_cls = None
    self.stats = {"actors_replaced": 0, "resent": 0, "sessions_lost": 0}

  @property
  def isolation_level(self) -> str | None:
    """The weakest level over the nodes (what the whole pool can promise)."""
    levels = [i["isolation_level"] for i in self.node_info]
    return max(levels, key=ISOLATION_LEVELS.index) if levels else None

  async def start(self) -> RayCodePool:
    import ray

    if not ray.is_initialized():
      raise RuntimeError("RayCodePool needs ray.init() (or a running cluster) first")
    self._actor_cls = ray.remote(_PoolActor)
    self._replacing = asyncio.Lock()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    self.actors = [self._spawn_actor(node["NodeID"]) for node in nodes]
    self.node_info = list(await asyncio.gather(*(a.start.remote() for a in self.actors)))
    return self

  def _spawn_actor(self, node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = self._actor_cls.options(
      max_concurrency=self.max_concurrency,
      num_cpus=self.actor_num_cpus,
      scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(self.config)
    self._node_of[actor] = node_id
    return actor

  async def _replace(self, dead) -> None:
    """Puts a fresh actor on `dead`'s node in its place (once, however many calls saw it die);
    drops it when the node is gone."""
    import ray

    async with self._replacing:
      if dead not in self.actors:
        return  # another call replaced it already
      i = self.actors.index(dead)
      node_id = self._node_of.pop(dead, None)
      alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
      if node_id in alive:
        actor = self._spawn_actor(node_id)
        try:
          info = await actor.start.remote()
        except ray.exceptions.RayError:
          info = None
        if info is not None:
          self.actors[i], self.node_info[i] = actor, info
          self.stats["actors_replaced"] += 1
          return
      del self.actors[i]
      del self.node_info[i]

  async def _stateless(self, method: str, *args):
    """Calls `method` on the next actor; one that died is replaced and the call re-sent."""
    import ray

    for _ in range(len(self.actors) + 2):
      actor = self._next()
      try:
        return await getattr(actor, method).remote(*args)
      except ray.exceptions.RayActorError:
        await self._replace(actor)
        self.stats["resent"] += 1
    raise RuntimeError("RayCodePool: every pool actor died while the call was re-sent")

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
      return await self._stateless("execute", code, stdin, timeout_s, None)
    import ray

    sid = str(session_id)
    actor = self._sessions.get(sid)
    if actor is None:
      actor = self._sessions[sid] = self._next()
    try:
      r = await actor.execute.remote(code, stdin, timeout_s, session_id)
    except ray.exceptions.RayActorError:
      await self._replace(actor)
      if self._sessions.get(sid) is actor:
        del self._sessions[sid]
      self._lost.add(sid)
      self.stats["sessions_lost"] += 1
      return ExecResult(
        "session_lost",
        "",
        "session_lost: the pool actor holding this session died during the call; it was not "
        "re-run, and the session's state is lost\n",
        0.0,
      )
    if sid in self._lost:
      self._lost.discard(sid)
      note = "[session lost earlier (its pool actor died): previous state is lost]\n"
      r = dataclasses.replace(r, stdout=note + r.stdout)
    return r

  async def close_session(self, session_id: str) -> bool:
    import ray

    self._lost.discard(str(session_id))
    actor = self._sessions.pop(str(session_id), None)
    if actor is None:
      return False
    try:
      return await actor.close_session.remote(str(session_id))
    except ray.exceptions.RayActorError:
      return False

  async def run_function(self, fn: Callable, *args, timeout_s: float = 5.0, **kwargs) -> Any:
    ok, value = await self._stateless("run_function", fn, args, kwargs, timeout_s)
    if not ok:
      raise FunctionRunError(*value)
    return value
