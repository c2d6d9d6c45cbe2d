"""KV-capacity-aware trajectory scheduler for SGLang servers (rStar2-Agent paper §3.2; docs/reference.md §5).

rStar2-Agent's load-balanced rollout scheduler admits a rollout on an engine only while the
engine's KV cache can hold it, instead of an even static split (on overflow SGLang evicts and
recomputes half the batch). Here a trajectory asks for a lease of `budget = prompt + max
response` tokens; it is admitted to the server with the most free capacity where the budget
fits, waits (FIFO) when none has room, and keeps that server for all its turns (prefix-cache
reuse). Capacity is `max_total_num_tokens` from /get_server_info times `utilization`; tokens
the server reports in use beyond our own reservations (/get_load, other clients) are subtracted.

Fleet failures (`SGLangEngine` health checks): `forget_server(url)` takes a server out of
rotation and drops the leases held on it (their trajectories re-acquire on another server);
`restore_server(url)` puts it back; `fail_waiters(error)` wakes every waiting trajectory with
``error`` (every server gone for longer than ``rollout.server_timeout_s``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from collections.abc import Mapping, Sequence


def choose_server(free: Mapping[str, int], active: Mapping[str, int], budget: int) -> str | None:
  """The server with the most free tokens that fits `budget` (ties: fewer active, then name);
  None when none fits."""
  fits = [u for u, f in free.items() if f >= budget]
  if not fits:
    return None
  return min(fits, key=lambda u: (-free[u], active.get(u, 0), u))


@dataclasses.dataclass
class _Server:
  capacity: int = 0  # usable tokens (max_total_num_tokens * utilization)
  reserved: int = 0  # sum of budgets of admitted trajectories
  external: int = 0  # tokens in use not explained by our reservations
  active: int = 0
  up: bool = True  # in rotation (False: taken out by the engine's health checks)


class KVCapacityScheduler:
  """Admits trajectories to servers by free KV capacity; sticky per trajectory.

  capacities: {url: max tokens}; when None, `refresh(client)` reads /get_server_info.
  """

  def __init__(
    self,
    urls: Sequence[str],
    capacities: Mapping[str, int] | None = None,
    utilization: float = 1.0,
  ):
    if not urls:
      raise ValueError("KVCapacityScheduler: no server urls")
    if not 0 < utilization <= 1:
      raise ValueError(f"KVCapacityScheduler.utilization: expected (0, 1], got {utilization}")
    self.utilization = utilization
    self._servers = {u: _Server() for u in urls}
    if capacities is not None:
      self.set_capacities(capacities)
    self._lease: dict[str, tuple[str, int]] = {}  # tid -> (url, budget)
    self._cond = asyncio.Condition()
    self._waiting: collections.deque = collections.deque()
    self.max_waiting_seen = 0
    self._error: BaseException | None = None

  def set_capacities(self, capacities: Mapping[str, int]) -> None:
    for u, c in capacities.items():
      if u not in self._servers:
        raise KeyError(f"KVCapacityScheduler: unknown server {u!r}")
      self._servers[u].capacity = int(int(c) * self.utilization)

  def set_external_usage(self, url: str, tokens_in_use: int) -> None:
    """Server-reported tokens in use (/get_load); the part above our reservations counts as
    someone else's."""
    s = self._servers[url]
    s.external = max(0, int(tokens_in_use) - s.reserved)

  def free(self) -> dict[str, int]:
    """Free tokens of each server in rotation."""
    return {u: s.capacity - s.reserved - s.external for u, s in self._servers.items() if s.up}

  async def forget_server(self, url: str) -> dict[str, int]:
    """Takes ``url`` out of rotation and drops every lease on it; returns {tid: budget} of
    the dropped leases (those trajectories re-acquire elsewhere with the same budget)."""
    s = self._servers[url]
    orphans = {tid: b for tid, (u, b) in self._lease.items() if u == url}
    for tid in orphans:
      del self._lease[tid]
    s.up, s.reserved, s.active, s.external = False, 0, 0, 0
    async with self._cond:
      self._cond.notify_all()
    return orphans

  async def restore_server(self, url: str) -> None:
    """Puts ``url`` back in rotation (after the engine brought it to the current weights)."""
    self._servers[url].up = True
    async with self._cond:
      self._cond.notify_all()

  async def fail_waiters(self, error: BaseException) -> None:
    """Every trajectory waiting for capacity (and every later one) raises ``error``."""
    self._error = error
    async with self._cond:
      self._cond.notify_all()

  def server_for(self, tid: str) -> str | None:
    lease = self._lease.get(tid)
    return lease[0] if lease else None

  def stats(self) -> dict:
    return {u: dataclasses.asdict(s) for u, s in self._servers.items()}

  async def acquire(self, tid: str, budget: int) -> str:
    """Waits until a server can hold `budget` tokens; returns its url (sticky for `tid`)."""
    if tid in self._lease:
      return self._lease[tid][0]
    biggest = max(s.capacity for s in self._servers.values())
    if budget > biggest:
      raise ValueError(
        f"trajectory {tid!r}: budget {budget} tokens exceeds every server's "
        f"KV capacity (largest {biggest}); lower response_budget"
      )
    async with self._cond:
      self._waiting.append(tid)
      self.max_waiting_seen = max(self.max_waiting_seen, len(self._waiting))
      try:
        while True:
          if self._error is not None:
            raise self._error
          if self._waiting[0] == tid:  # FIFO: no starvation of big budgets
            url = choose_server(
              self.free(), {u: s.active for u, s in self._servers.items()}, budget
            )
            if url is not None:
              break
          await self._cond.wait()
      finally:
        self._waiting.remove(tid)
        self._cond.notify_all()
      s = self._servers[url]
      s.reserved += budget
      s.active += 1
      self._lease[tid] = (url, budget)
      return url

  async def release(self, tid: str) -> None:
    lease = self._lease.pop(tid, None)
    if lease is None:
      return
    url, budget = lease
    async with self._cond:
      s = self._servers[url]
      s.reserved = max(0, s.reserved - budget)
      s.active = max(0, s.active - 1)
      self._cond.notify_all()

  @contextlib.asynccontextmanager
  async def lease(self, tid: str, budget: int):
    url = await self.acquire(tid, budget)
    try:
      yield url
    finally:
      await self.release(tid)
