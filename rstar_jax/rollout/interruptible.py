"""Partial rollouts: what happens to in-flight generation when new weights are pushed.

`InterruptibleEngine(engine, mode)` wraps any rollout ``Engine`` (JaxSampler, SGLangEngine, a
simulator) for asynchronous RL, where weight pushes land while trajectories are still being
generated. Two policies (``rl.partial_rollout``):

  * ``"continue"``: in-flight requests go on with the new weights; every token keeps the
    version that produced it (`GenerateResult.weight_versions`), so the learner's staleness
    filter sees the oldest one. Engines that swap weights between decode steps themselves
    (``swaps_weights_in_flight = True``: the JaxSampler) are simply updated. For the others
    (SGLang) the push is ``pause_generation(mode="abort")`` -> load the weights ->
    ``continue_generation()``: the server returns every running request aborted with its
    partial output (produced by the old weights), and this wrapper resubmits the remainder
    (prompt + partial output, ``max_new_tokens`` reduced) once generation continues, then
    merges both parts. This is the interrupt-and-resubmit scheme of AReaL's interruptible
    rollouts and slime's ``--partial-rollout`` (there the partial sample is recycled).
  * ``"restart"``: trajectories that were in flight at the push are aborted and generated again
    from the start with the new weights. A trajectory is "in flight" from its first generate
    call on; the rollout driver marks it with a `RolloutTicket` (a context variable set around
    the trajectory), the wrapper aborts the ticket's running request (``engine.abort(rid)``, or
    the pause for SGLang) and answers any later request of that trajectory with an empty
    ``"abort"`` result, and sets ``ticket.restarted`` so the driver reruns it. Requests without
    a ticket (evaluation, hard-subset sampling) are never restarted; they continue.

SGLang endpoints used (``sglang.srt.entrypoints.http_server``): ``POST /pause_generation
{"mode": "abort" | "retract" | "in_place"}`` ("abort" returns every running request with
finish_reason abort and keeps the server paused), ``POST /continue_generation {}``, and
``POST /abort_request {"rid": ...}`` for single requests.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from rstar_jax.models import routes as routes_lib
from rstar_jax.rollout.types import GenerateRequest, GenerateResult

log = logging.getLogger(__name__)

PARTIAL_ROLLOUT_MODES = ("continue", "restart")


@dataclasses.dataclass
class RolloutTicket:
  """Marks one trajectory attempt (set as `CURRENT_TICKET` around ``runner.rollout``).

  epoch: the wrapper's push count when the trajectory first generated (None before that).
  restarted: set by the wrapper when a push in "restart" mode aborted this trajectory.
  """

  epoch: int | None = None
  restarted: bool = False


CURRENT_TICKET: contextvars.ContextVar[RolloutTicket | None] = contextvars.ContextVar(
  "rstar_jax_rollout_ticket", default=None
)


def _continuation_seed(seed: int | None, done: int) -> int | None:
  # A resubmitted remainder must not replay the random stream of the tokens it already has.
  return None if seed is None else (int(seed) * 1_000_003 + 7_919 * done) % (2**63 - 1)


class InterruptibleEngine:
  """Wraps ``engine`` so weight pushes continue or restart in-flight trajectories.

  Args:
    engine: the rollout engine (``generate``, ``update_weights``, ``weight_version``; SGLang
      style engines also ``pause_generation`` / ``continue_generation``).
    mode: "continue" or "restart" (module docstring).

  Attributes:
    version_history: every weight version the engine has served, in push order (the first is
      the version at construction); the learner measures staleness in pushes with it.
    stats: counters since construction: ``interrupted_requests`` (aborted by a push),
      ``resubmitted_requests`` (continued after one), ``restarted_trajectories``.
  """

  def __init__(self, engine, mode: str = "continue"):
    if mode not in PARTIAL_ROLLOUT_MODES:
      raise ValueError(
        f"InterruptibleEngine.mode: expected one of {list(PARTIAL_ROLLOUT_MODES)}, got {mode!r}"
      )
    self.inner = engine
    self.mode = mode
    self.version_history: list[int] = [int(engine.weight_version)]
    self.stats = collections.Counter()
    self._epoch = 0
    self._resumed: asyncio.Event | None = None
    self._inflight: dict[int, tuple[GenerateRequest, RolloutTicket | None]] = {}
    self._next_key = 0
    self._push_lock: asyncio.Lock | None = None

  def __getattr__(self, name):  # trajectory_lease, abort, close, wait_healthy, health, ...
    return getattr(self.inner, name)

  @property
  def weight_version(self) -> int:
    return self.inner.weight_version

  def lag(self, version: int) -> int:
    """Pushes since ``version``: how many served versions are newer than it."""
    return sum(1 for v in self.version_history if v > version)

  def _event(self) -> asyncio.Event:
    if self._resumed is None:
      self._resumed = asyncio.Event()
      self._resumed.set()
    return self._resumed

  # ------------------------------------------------------------------ generate

  async def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
    ticket = CURRENT_TICKET.get()
    return list(await asyncio.gather(*(self._one(r, ticket) for r in requests)))

  def _abort_result(self) -> GenerateResult:
    return GenerateResult([], [], "abort", self.weight_version, [])

  async def _one(self, req: GenerateRequest, ticket: RolloutTicket | None) -> GenerateResult:
    await self._event().wait()
    if ticket is not None:
      if ticket.epoch is None:
        ticket.epoch = self._epoch
      elif self.mode == "restart" and ticket.epoch < self._epoch:
        self._mark_restarted(ticket)  # it sat in a tool call across a push
      if ticket.restarted:
        return self._abort_result()
    ids: list[int] = []
    lps: list[float] = []
    vers: list[int] = []
    prefill: int | None = 0  # summed over resubmissions; None once any part is unknown
    parts: list = []  # (first position, routes) of each part that reported MoE routes
    cur = req
    while True:
      key, epoch = self._next_key, self._epoch
      self._next_key += 1
      self._inflight[key] = (cur, ticket)
      try:
        res = (await self.inner.generate([cur]))[0]
      finally:
        self._inflight.pop(key, None)
      ids += list(res.output_ids)
      lps += list(res.logprobs)
      vers += res.token_versions()
      prefill = (
        None if prefill is None or res.prefill_tokens is None else prefill + res.prefill_tokens
      )
      if res.routes is not None:  # positions of req.input_ids + ids: one coordinate system
        parts.append((res.routes_start, res.routes))
      merged = functools.partial(self._merged, prefill=prefill, routes=(len(req.input_ids), parts))
      interrupted = res.finish_reason == "abort" and self._epoch != epoch
      if not interrupted:
        return merged(ids, lps, vers, res.finish_reason)
      self.stats["interrupted_requests"] += 1
      if ticket is not None and ticket.restarted:
        return merged(ids, lps, vers, "abort")
      await self._event().wait()
      left = req.sampling.max_new_tokens - len(ids)
      if left <= 0:
        return merged(ids, lps, vers, "length")
      self.stats["resubmitted_requests"] += 1
      sp = dataclasses.replace(
        req.sampling, max_new_tokens=left, seed=_continuation_seed(req.sampling.seed, len(ids))
      )
      cur = GenerateRequest(
        list(req.input_ids) + ids,
        sp,
        rid=req.rid and f"{req.rid}.{self.stats['resubmitted_requests']}",
      )

  def _merged(self, ids, lps, vers, finish, prefill=None, routes=(0, ())) -> GenerateResult:
    """The parts of one request as one result; ``routes`` = (input length, [(first position,
    routes)]) of the parts' MoE routes, written into one array (the first part to report a
    position wins: its tokens were sampled with those routes)."""
    n_in, parts = routes
    out, lo = None, 0
    if parts:
      lo = min(start for start, _ in parts)
      out = routes_lib.empty_routes(n_in + len(ids) - lo, np.shape(parts[0][1])[1:])
      for start, r in parts:
        routes_lib.write_routes(out, start - lo, r)
    return GenerateResult(
      ids,
      lps,
      finish,
      min(vers, default=self.weight_version),
      vers,
      prefill_tokens=prefill,
      routes=out,
      routes_start=lo,
    )

  def _mark_restarted(self, ticket: RolloutTicket) -> None:
    if not ticket.restarted:
      ticket.restarted = True
      self.stats["restarted_trajectories"] += 1

  # ------------------------------------------------------------------ weight push

  async def update_weights(self, config: Any, params: Any, version: int | None = None) -> None:
    """Pushes new weights; in-flight work continues or restarts per ``mode``."""
    if self._push_lock is None:
      self._push_lock = asyncio.Lock()
    async with self._push_lock:
      native = bool(getattr(self.inner, "swaps_weights_in_flight", False))
      pausing = hasattr(self.inner, "pause_generation") and not native
      self._epoch += 1
      if self.mode == "restart":
        for req, ticket in list(self._inflight.values()):
          if ticket is not None:
            self._mark_restarted(ticket)
            if not pausing and req.rid is not None and hasattr(self.inner, "abort"):
              await self.inner.abort(req.rid)
      if pausing:
        self._event().clear()
        try:
          await self.inner.pause_generation(mode="abort")
          await self.inner.update_weights(config, params, version)
        finally:
          try:
            await self.inner.continue_generation()
          finally:
            self._event().set()
      else:
        await self.inner.update_weights(config, params, version)
      self.version_history.append(int(self.inner.weight_version))
