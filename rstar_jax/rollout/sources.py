"""Group sources: where the RL loop's trajectory groups come from (`GroupSource`).

The RL loop asks a source for ``n`` groups per step and does not know how they were made;
choosing asynchronous RL is choosing the source:

  * `SyncSource` (``rl.max_staleness = 0``): draws the step's problems from the stage's
    iterator and makes their groups now, with the policy that will be trained (on-policy);
  * `async_source.AsyncSource` (``rl.max_staleness >= 1``): a producer keeps groups in flight
    ahead of the learner with older weights, behind its own `InterruptibleEngine` wrapper.

Both make every group with `groups.make_groups` / `groups.make_group` (one seed rule, one retry
rule, one multi-process gather). Evaluation and the hard subset are a `SyncSource` too, with k
samples per problem (`SyncSource.groups_of` a given problem list).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rstar_jax.rollout import groups as groups_lib

log = logging.getLogger(__name__)

PROBLEM_STRIDE = 7_368_787  # group i of a synchronous step: seed0 + i * stride


@dataclasses.dataclass
class StageFeed:
  """What the loop's current stage offers a source.

  key: identifies the stage (a new key starts a new stage; the asynchronous source drains).
  iterator: the stage's resumable `EpochIterator` over ``dataset``.
  dataset: the stage's problems (the asynchronous source checkpoints indices into it).
  settings: the stage's rollout settings (`rollout_settings`).
  steps_left: learner steps left in the stage, this one included.
  """

  key: Any
  iterator: Any
  dataset: Sequence[Any]
  settings: Any
  steps_left: int


class WeightTransfer(Protocol):
  """Where the RL loop pushes a new policy (an engine, or a transport in front of one)."""

  async def update_weights(self, model_config, params, version: int) -> Any: ...


class GroupSource(Protocol):
  """Hands the RL loop finished trajectory groups.

  engine: where the loop pushes new weights (the engine the groups are sampled with; a
    `WeightTransfer`).
  off_policy: groups may be sampled by older weights than the ones trained (the loop then logs
    the importance ratios of the sampler's log-probs against the learner's).
  """

  engine: Any
  off_policy: bool

  async def take(self, n: int, *, seed: int, feed: StageFeed) -> groups_lib.Groups: ...

  def state_dict(self) -> dict: ...

  def load_state_dict(self, state: dict | None) -> None: ...

  async def close(self) -> None: ...


def group_seeds(seed0: int, n: int, stride: int = PROBLEM_STRIDE) -> list[int]:
  """Seeds of ``n`` groups made together: group i gets ``seed0 + i * stride`` (mod 2^31 - 1)."""
  return [(int(seed0) + i * int(stride)) % groups_lib.SEED_MODULUS for i in range(n)]


class SyncSource:
  """Groups made now, with the policy that will be trained (on-policy): the RL step's (the
  stage's next ``n`` problems), evaluation's and the hard subset's (`groups_of` a given list).

  Args:
    runner: the `AgentRunner` (problem -> trajectory).
    num_samples: trajectories per group (RL: ``rl.oversample * rl.group_size``; eval: k).
    max_retries: failed attempts of one trajectory before the call raises.
    on_start: called with the call's trajectory count; returns the per-trajectory tick
      (progress lines), or None.
    problem_stride: group i of a call is seeded ``seed + i * problem_stride`` (`group_seeds`).
  """

  off_policy = False

  def __init__(
    self,
    runner,
    *,
    num_samples: int,
    max_retries: int,
    on_start: Callable[[int], Callable[[], None] | None] | None = None,
    problem_stride: int = PROBLEM_STRIDE,
  ):
    self.runner = runner
    self.N = int(num_samples)
    self.max_retries = int(max_retries)
    self.on_start = on_start
    self.problem_stride = int(problem_stride)

  @property
  def engine(self):
    """The runner's own engine: the policy trained is the one sampled next."""
    return self.runner.engine

  async def take(self, n: int, *, seed: int, feed: StageFeed) -> groups_lib.Groups:
    """The stage's next ``n`` problems (``feed.iterator``), one group each."""
    return await self.groups_of(feed.iterator.next_batch(n), seed=seed, settings=feed.settings)

  async def groups_of(self, problems: Sequence[Any], *, seed: int, settings) -> groups_lib.Groups:
    """One group of ``num_samples`` per problem, seeded by `group_seeds` (``seed``)."""
    tick = self.on_start(len(problems) * self.N) if self.on_start else None
    return await groups_lib.make_groups(
      self.runner,
      problems,
      group_seeds(seed, len(problems), self.problem_stride),
      self.N,
      settings,
      max_retries=self.max_retries,
      on_done=tick,
    )

  def state_dict(self) -> dict:
    return {}

  def load_state_dict(self, state: dict | None) -> None:
    if state and state.get("pending"):
      log.warning(
        "resuming an asynchronous run (rl.max_staleness >= 1) synchronously: its %d "
        "in-flight prompt groups are skipped",
        len(state["pending"]),
      )

  async def close(self) -> None:
    return None
