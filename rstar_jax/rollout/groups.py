"""Trajectory groups: the one place a problem's samples are made (RL, asynchronous RL, evaluation).

A *group* is ``n`` trajectories of one problem. Every caller makes groups with `make_group`
(or `make_groups` for a list of problems, with the multi-process split and gather), so there is
one seed rule, one retry rule and one gather:

  * seeds: the caller picks one seed per group (a pure function of its own counters, never of
    timing); sample ``j`` of the group uses `sample_seed(group_seed, j)`;
  * retries: a rollout that raised (engine or agent-loop failure) or whose tool call ended with
    ``internal_error`` (the pool lost its worker: not the policy's fault, keeping it would bias
    the sample) is run again with the same seed, after a capped exponential back-off; after
    ``max_retries`` failed attempts the group raises, naming the problem and sample. A rollout
    that an `interruptible.InterruptibleEngine` aborted at a weight push in "restart" mode is
    run again without counting as a failure;
  * multi-process: with several JAX processes, `make_groups` makes the groups of this
    process's contiguous share of the problems (`hostdata.local_indices`) and all-gathers them,
    so every process holds every group; counters are summed over processes.

The sources (`GroupSource`: `sources.SyncSource`, `async_source.AsyncSource`) decide *which*
problems and seeds; this module decides *how* a group is made.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from rstar_jax.distributed import hostdata
from rstar_jax.errors import CheckpointedStop
from rstar_jax.rollout import interruptible

log = logging.getLogger(__name__)

SEED_MODULUS = 2**31 - 1
SAMPLE_STRIDE = 104_729  # a prime: samples of one group get well-separated seeds


def sample_seed(group_seed: int, j: int) -> int:
  """Seed of sample ``j`` of the group whose seed is ``group_seed``."""
  return (int(group_seed) + int(j) * SAMPLE_STRIDE) % SEED_MODULUS


@dataclasses.dataclass
class Groups:
  """What a source hands the RL loop: ``groups[i][j]`` is sample j of ``problems[i]``.

  retries: failed rollouts retried, summed over processes.
  generated: trajectories generated for these groups, summed over processes.
  metrics: the source's own per-take metrics (asynchronous source: ``async/*``).
  ids: per group ``(seq, group seed)``: its place in the source's issue order (-1 where the
    source keeps none) and the seed its samples derive from (`sample_seed`); with the problem
    and the sample index it names a trajectory (the RL loop's ledger, `trajectory_ledger`).
  """

  problems: list[Any]
  groups: list[list[Any]]
  retries: int = 0
  generated: int = 0
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)
  ids: list[tuple[int, int]] | None = None


def _lost_worker(traj) -> bool:
  return any(c.status == "internal_error" for c in traj.tool_calls)


async def make_trajectory(
  runner,
  problem,
  seed: int,
  settings,
  *,
  max_retries: int,
  counters: collections.Counter | None = None,
  name: str = "",
):
  """One trajectory with the retry rule (module docstring); ``counters`` gets ``retries`` and
  ``restarted_trajectories``."""
  counters = counters if counters is not None else collections.Counter()
  failures = 0
  while True:
    ticket = interruptible.RolloutTicket()
    token = interruptible.CURRENT_TICKET.set(ticket)
    try:
      traj = await runner.rollout(problem, seed=seed, settings=settings)
      err = None if not _lost_worker(traj) else "tool call ended with internal_error (worker lost)"
    except (asyncio.CancelledError, CheckpointedStop):  # the run stops: no retry
      raise
    except Exception as e:  # noqa: BLE001 - engine / agent failure: retry the same rollout
      traj, err = None, e
    finally:
      interruptible.CURRENT_TICKET.reset(token)
    if ticket.restarted:  # a push in "restart" mode aborted it: not a failure
      counters["restarted_trajectories"] += 1
      continue
    if err is None:
      return traj
    failures += 1
    if failures > max_retries:
      last = err if isinstance(err, str) else repr(err)
      raise RuntimeError(f"rollout of {name} failed {failures} times; last error: {last}")
    counters["retries"] += 1
    log.warning("rollout of %s failed on attempt %d: %s; retrying", name, failures, err)
    await asyncio.sleep(min(0.1 * 2 ** (failures - 1), 2.0))


async def make_group(
  runner,
  problem,
  group_seed: int,
  n: int,
  settings,
  *,
  max_retries: int,
  counters: collections.Counter | None = None,
  on_done: Callable[[], None] | None = None,
  name: str = "problem",
) -> list[Any]:
  """``n`` trajectories of ``problem``, sample j seeded `sample_seed(group_seed, j)`, all
  concurrent; ``on_done`` is called after each finished trajectory (progress lines)."""

  async def one(j):
    traj = await make_trajectory(
      runner,
      problem,
      sample_seed(group_seed, j),
      settings,
      max_retries=max_retries,
      counters=counters,
      name=f"{name} sample {j}",
    )
    if on_done is not None:
      on_done()
    return traj

  return list(await asyncio.gather(*(one(j) for j in range(n))))


async def make_groups(
  runner,
  problems: Sequence[Any],
  group_seeds: Sequence[int],
  n: int,
  settings,
  *,
  max_retries: int,
  on_done: Callable[[], None] | None = None,
) -> Groups:
  """One group per problem (``group_seeds[i]`` for ``problems[i]``), this process's share made
  here and all-gathered (module docstring); ``retries`` / ``generated`` summed over processes."""
  if len(group_seeds) != len(problems):
    raise ValueError(f"make_groups: {len(problems)} problems but {len(group_seeds)} group seeds")
  counters: collections.Counter = collections.Counter()
  share = hostdata.local_indices(len(problems))  # [multi-process] this process's problems
  made = await asyncio.gather(
    *(
      make_group(
        runner,
        problems[i],
        group_seeds[i],
        n,
        settings,
        max_retries=max_retries,
        counters=counters,
        on_done=on_done,
        name=f"problem {i}",
      )
      for i in share
    )
  )
  local = {(i, j): t for i, g in zip(share, made) for j, t in enumerate(g)}
  generated = int(hostdata.sum_over_processes(len(local)))
  retries = int(hostdata.sum_over_processes(counters["retries"]))
  out = hostdata.allgather_dict(local)  # [multi-process] every process gets every group
  groups = [[out[(i, j)] for j in range(n)] for i in range(len(problems))]
  ids = [(-1, int(s)) for s in group_seeds]
  return Groups(list(problems), groups, retries, generated, ids=ids)
