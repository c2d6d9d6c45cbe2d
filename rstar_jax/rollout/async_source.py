"""Asynchronous RL's group source: rollouts for the next steps overlap the learner's update.

With ``rl.max_staleness = k >= 1`` the RL loop stops waiting for itself: `AsyncSource` runs a
producer on the event loop that keeps up to ``k * batch_prompts`` prompt groups issued but not
yet trained on (each group = one problem's ``oversample * group_size`` trajectories); the
learner takes ``batch_prompts`` finished groups per step (the first to finish; handed over in
issue order, so a step's batch does not depend on which of them finished first), and runs its
update in a worker thread (JAX releases the GIL) while the producer generates the next ones with
the weights it has. A weight push lands mid-rollout (``rl.partial_rollout``: in-flight work
continues with the new weights, or restarts; see `rollout.interruptible`).

Staleness (AReaL's ``max_head_offpolicyness``, SkyRL's ``max_staleness_steps``, verl's
``staleness_threshold``): the lag of a token is the number of weight pushes between the version
that sampled it and the version being trained. A group is used only if every trajectory's oldest
generated token has lag <= k; a group failing that is not trained on, counted
(``async/dropped_stale_trajectories``, ``async/dropped_stale_groups``) and generated again from
the same prompt, so no prompt is lost. With the issue cap above, only groups overtaken many
times by later ones (long tails) or pushed past by "continue" partial rollouts ever reach it.

Data position: groups are drawn from the loop's `EpochIterator` when issued; the checkpoint
keeps the iterator state (the issue frontier) plus every issued-but-untrained group as (sequence
number, problem index, seed). A resumed run generates those again first, from the same
problems and seeds, then continues with the iterator: every prompt is trained on exactly once
in the order it was drawn, whatever the overlap was when the run stopped. Within a stage the
producer issues exactly the stage's ``steps * batch_prompts`` groups, so a stage boundary
(new data source, response budget) drains the pipeline.

Per-step metrics (`take`): ``async/lag_{d}_tokens`` (generated tokens trained on, by lag),
``async/lag_mean``, ``async/dropped_stale_trajectories`` / ``_groups``,
``async/learner_idle_frac`` (share of the time since the previous step the learner spent
waiting for groups), ``async/rollout_idle_frac`` (share of it with no group in flight),
``async/groups_in_flight`` / ``_buffered``, ``async/restarted_trajectories``. The learner adds
``async/is_ratio_*`` (`learner.batch.importance_metrics`) because the source is ``off_policy``.

The source wraps the runner's engine in its own `InterruptibleEngine` (the runner it was given
keeps the raw engine: evaluation and the hard-subset sampling never see the wrapper) and makes
every group with `groups.make_group` (the seed, retry and restart rules). k = 0 never builds any
of this: the loop gets a `sources.SyncSource`.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from rstar_jax.rollout import groups as groups_lib
from rstar_jax.rollout import interruptible
from rstar_jax.rollout.sources import StageFeed

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class GroupTicket:
  """One prompt group: its place in the issue order, the problem (index into the stage's
  dataset) and the seed its trajectories derive from."""

  seq: int
  problem_index: int
  seed: int


def group_seed(base_seed: int, seq: int) -> int:
  """Deterministic rollout seed of group ``seq`` (independent of timing)."""
  return (int(base_seed) * 2_654_435_761 + 97_531 * (int(seq) + 1)) % (2**31 - 1)


def oldest_version(traj) -> int | None:
  """The oldest weight version among a trajectory's generated tokens (None: it has none)."""
  vs = [int(v) for v, m in zip(traj.weight_versions, traj.loss_mask) if m]
  return min(vs) if vs else None


def staleness_metrics(
  trajs: Sequence[Any], lag: Callable[[int], int], max_lag: int
) -> dict[str, float]:
  """Generated tokens by version lag: ``async/lag_{d}_tokens`` for d = 0..max(max_lag, seen)."""
  hist: collections.Counter = collections.Counter()
  for t in trajs:
    for v, m in zip(t.weight_versions, t.loss_mask):
      if m:
        hist[lag(int(v))] += 1
  top = max([max_lag] + list(hist))
  out = {f"async/lag_{d}_tokens": float(hist[d]) for d in range(top + 1)}
  total = sum(hist.values())
  out["async/lag_mean"] = (sum(d * n for d, n in hist.items()) / total) if total else 0.0
  return out


class _IdleClock:
  """Accumulates the time during which a condition held (e.g. no rollout in flight)."""

  def __init__(self):
    self.total = 0.0
    self._since: float | None = time.monotonic()

  def set(self, idle: bool) -> None:
    now = time.monotonic()
    if idle and self._since is None:
      self._since = now
    elif not idle and self._since is not None:
      self.total += now - self._since
      self._since = None

  def read(self) -> float:
    extra = (time.monotonic() - self._since) if self._since is not None else 0.0
    return self.total + extra


class AsyncSource:
  """The producer side of the asynchronous loop (module docstring), a `sources.GroupSource`.

  Args:
    runner: the `AgentRunner`; the source rolls out through a copy of it whose engine is
      wrapped in an `InterruptibleEngine` (``self.engine``: the loop pushes weights there).
    max_staleness: k >= 1.
    partial_rollout: "continue" | "restart".
    num_samples: trajectories per group (N = oversample * G).
    batch_prompts: groups per learner step (P).
    base_seed: seeds the groups' rollout seeds.
    max_retries: failed attempts of one trajectory before the step raises.
  """

  off_policy = True  # groups may be sampled by weights older than the ones trained

  def __init__(
    self,
    runner,
    *,
    max_staleness: int,
    partial_rollout: str,
    num_samples: int,
    batch_prompts: int,
    base_seed: int,
    max_retries: int = 3,
  ):
    if max_staleness < 1:
      raise ValueError(f"AsyncSource.max_staleness: expected >= 1, got {max_staleness}")
    engine = runner.engine
    if not isinstance(engine, interruptible.InterruptibleEngine):
      engine = interruptible.InterruptibleEngine(engine, partial_rollout)
    self.engine: interruptible.InterruptibleEngine = engine
    self.runner = copy.copy(runner)  # shares tokenizer, pool and prompt cache; not the engine
    self.runner.engine = engine
    self.k = int(max_staleness)
    self.N = int(num_samples)
    self.P = int(batch_prompts)
    self.base_seed = int(base_seed)
    self.max_retries = int(max_retries)
    self.capacity = self.k * self.P
    self._pending: dict[int, GroupTicket] = {}  # issued, not yet trained on
    self._reissue: collections.deque[GroupTicket] = collections.deque()
    self._finished: collections.deque[tuple[GroupTicket, list]] = collections.deque()
    self._tasks: dict[int, asyncio.Task] = {}
    self._next_seq = 0
    self._stage_key: Any = None
    self._budget = 0  # groups still to draw in this stage
    self._iterator = None
    self._dataset: Sequence[Any] = ()
    self._index_of: dict[int, int] = {}
    self._settings = None
    self._cond: asyncio.Condition | None = None
    self._producer: asyncio.Task | None = None
    self._error: BaseException | None = None
    self._idle = _IdleClock()
    self._counters = collections.Counter()
    self._last_take_end: float | None = None
    self._idle_at_last = 0.0

  # ------------------------------------------------------------------ checkpoint state

  def state_dict(self) -> dict:
    """Issued-but-untrained groups (in flight or finished, regenerated on resume)."""
    pend = sorted(self._pending.values(), key=lambda g: g.seq)
    return {"pending": [[g.seq, g.problem_index, g.seed] for g in pend], "next_seq": self._next_seq}

  def load_state_dict(self, state: dict | None) -> None:
    if not state:
      return
    self._next_seq = int(state["next_seq"])
    self._pending = {int(s): GroupTicket(int(s), int(i), int(sd)) for s, i, sd in state["pending"]}
    self._reissue = collections.deque(sorted(self._pending.values(), key=lambda g: g.seq))

  # ------------------------------------------------------------------ producer

  def _begin_stage(self, key, iterator, dataset, settings, steps_left: int) -> None:
    self._stage_key = key
    self._iterator = iterator
    self._dataset = list(dataset)
    self._index_of = {id(p): i for i, p in enumerate(self._dataset)}
    self._settings = settings
    bad = [
      g.problem_index
      for g in self._pending.values()
      if not 0 <= g.problem_index < len(self._dataset)
    ]
    if bad:
      raise ValueError(
        f"async rollouts: checkpointed groups name problems {bad[:5]} outside "
        f"the stage's {len(self._dataset)}-problem dataset"
      )
    self._budget = max(0, steps_left * self.P - len(self._pending))
    if self._cond is None:
      self._cond = asyncio.Condition()
    if self._last_take_end is None:  # idle time counts from the first stage's start
      self._idle = _IdleClock()
    self._producer = asyncio.get_running_loop().create_task(self._produce())

  def _in_flight(self) -> int:
    return len(self._tasks)

  async def _produce(self) -> None:
    try:
      while True:  # runs until the stage changes or the loop stops (stale groups come back)
        async with self._cond:
          await self._cond.wait_for(
            lambda: self._reissue or (self._budget > 0 and len(self._pending) < self.capacity)
          )
          if self._reissue:
            g = self._reissue.popleft()
          else:
            problem = next(self._iterator)
            g = GroupTicket(
              self._next_seq,
              self._index_of[id(problem)],
              group_seed(self.base_seed, self._next_seq),
            )
            self._next_seq += 1
            self._budget -= 1
            self._pending[g.seq] = g
          self._tasks[g.seq] = asyncio.get_running_loop().create_task(self._run_group(g))
          self._idle.set(False)
    except asyncio.CancelledError:
      raise
    except BaseException as e:  # noqa: BLE001 - surfaced to the learner in take()
      self._error = e
      async with self._cond:
        self._cond.notify_all()

  async def _run_group(self, g: GroupTicket) -> None:
    try:
      problem = self._dataset[g.problem_index]
      trajs = await groups_lib.make_group(
        self.runner,
        problem,
        g.seed,
        self.N,
        self._settings,
        max_retries=self.max_retries,
        counters=self._counters,
        name=f"{getattr(problem, 'problem', problem)!r:.60} (group {g.seq})",
      )
    except asyncio.CancelledError:
      raise
    except BaseException as e:  # noqa: BLE001
      self._error = e
      trajs = None
    async with self._cond:
      self._tasks.pop(g.seq, None)
      if trajs is not None:
        self._finished.append((g, list(trajs)))
      self._idle.set(not self._tasks)
      self._cond.notify_all()

  # ------------------------------------------------------------------ learner side

  def _group_lag(self, trajs) -> int:
    vs = [v for v in (oldest_version(t) for t in trajs) if v is not None]
    return max((self.engine.lag(v) for v in vs), default=0)

  async def take(self, n: int, *, seed: int = 0, feed: StageFeed) -> groups_lib.Groups:
    """The next ``batch_prompts`` fresh finished groups: the first to finish, returned in issue
    order. The order matters for reproducibility only: the batch's float sums follow it, and a
    run restarted after a kill regenerates its in-flight groups concurrently, so their finish
    order is the timing's, not the undisturbed run's.

    Args:
      n: groups per step; must be ``batch_prompts`` (the issue cap is built on it).
      seed: unused (each group's seed comes from ``base_seed`` and its issue number).
      feed: the loop's stage; a new ``feed.key`` starts the stage's producer, and
        ``feed.steps_left`` (this step included) bounds the issuing.
    """
    del seed
    if n != self.P:
      raise ValueError(f"AsyncSource.take: n expected batch_prompts={self.P}, got {n}")
    if self._producer is None or self._stage_key != feed.key:
      if self._producer is not None:
        if self._pending or self._tasks:
          raise RuntimeError("async rollouts: a new stage started with groups still in flight")
        self._producer.cancel()
      self._begin_stage(feed.key, feed.iterator, feed.dataset, feed.settings, feed.steps_left)
    t0 = time.monotonic()
    taken: list[tuple[GroupTicket, list]] = []
    stale_trajs = stale_groups = 0
    while len(taken) < self.P:
      async with self._cond:
        await self._cond.wait_for(lambda: self._finished or self._error is not None)
        if self._error is not None:
          raise self._error
        g, trajs = self._finished.popleft()
        if self._group_lag(trajs) > self.k:
          stale_groups += 1
          stale_trajs += sum(
            1
            for t in trajs
            if oldest_version(t) is not None and self.engine.lag(oldest_version(t)) > self.k
          )
          self._reissue.append(g)
        else:
          del self._pending[g.seq]
          taken.append((g, trajs))
        self._cond.notify_all()
    taken.sort(key=lambda gt: gt[0].seq)
    now = time.monotonic()
    wait = now - t0
    period = now - self._last_take_end if self._last_take_end is not None else wait
    idle_now = self._idle.read()
    rollout_idle = idle_now - self._idle_at_last
    self._last_take_end, self._idle_at_last = now, idle_now
    trajs = [t for _, ts in taken for t in ts]
    metrics = staleness_metrics(trajs, self.engine.lag, self.k)
    c = self._counters
    metrics.update(
      {
        "async/dropped_stale_trajectories": float(stale_trajs),
        "async/dropped_stale_groups": float(stale_groups),
        "async/learner_wait_s": wait,
        "async/learner_idle_frac": wait / period if period > 0 else 0.0,
        "async/rollout_idle_frac": min(1.0, rollout_idle / period) if period > 0 else 0.0,
        "async/groups_in_flight": float(self._in_flight()),
        "async/groups_buffered": float(len(self._finished)),
        "async/restarted_trajectories": float(c.pop("restarted_trajectories", 0)),
        "async/interrupted_requests": float(self.engine.stats["interrupted_requests"]),
        "async/resubmitted_requests": float(self.engine.stats["resubmitted_requests"]),
        "async/rollout_retries": float(c.pop("retries", 0)),
      }
    )
    problems = [self._dataset[g.problem_index] for g, _ in taken]
    # The producer generates ahead; a step is charged with the groups it consumes.
    return groups_lib.Groups(
      problems,
      [ts for _, ts in taken],
      retries=int(metrics["async/rollout_retries"]),
      generated=len(problems) * self.N,
      metrics=metrics,
      ids=[(g.seq, g.seed) for g, _ in taken],
    )

  async def close(self) -> None:
    """Cancels the producer and every group in flight (their tickets stay pending, so a
    checkpoint written after this regenerates them)."""
    tasks = ([self._producer] if self._producer is not None else []) + list(self._tasks.values())
    for t in tasks:
      t.cancel()
    for t in tasks:
      try:
        await t
      except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
        pass
    self._tasks.clear()
    self._producer = None
    # Finished-but-untrained groups are regenerated too: their tickets are still pending.
    self._finished.clear()
    self._reissue = collections.deque(sorted(self._pending.values(), key=lambda g: g.seq))
    self._stage_key = None
