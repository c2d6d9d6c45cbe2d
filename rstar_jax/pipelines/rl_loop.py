"""The GRPO-RoC training loop (rStar2-Agent's order of operations and stages; ASTER's GRPO).

`RLLoop.step` only sequences named stages; each is a method a test can call alone, and the
pure math lives in `rstar_jax.rl` and `rstar_jax.learner`:

  rollout      ``train.batch_prompts`` problems from the resumable iterator, ``rl.oversample *
               rl.group_size`` trajectories each through engine + agent loop + code pool
               (`collect_rollouts`: a failed rollout is retried with the same seed)  -> Rollouts
  score        rewards (math verification out of process, bounded) and p_err + p_format
               penalties as [P, N] host arrays                                       -> Scores
  select       `rstar_jax.rl.selection.select_rollouts`: zero-variance filter, down-sampling
               to G (``rl.roc_mode``), advantages (``rl.advantage``); both registry names
                                                                                     -> Selected
  build_batch  a fixed-shape padded batch: ``batch_prompts * G`` rows (empty rows weigh 0),
               a power-of-two length bucket (one compiled step per bucket); packed
               several trajectories per row by default (``train.pack_rows``)        -> batch
  update       optional old-log-prob recompute, then ``rl.ppo_epochs`` x
               ``rl.ppo_mini_batches`` jitted ``rl_step`` calls                       -> metrics
  push         one `WeightTransfer` call (default: the engine's ``update_weights``; version =
               optimizer step)                                                       -> seconds
  log          held-out evaluation every ``train.eval_every`` steps; metrics.jsonl / TensorBoard

Stages: each stage sets the response budget and turn limit; a stage may reset the optimizer and
train on the hard subset (problems the policy at the stage start does not solve k of k) or on
the "recent" subset (problems not all-correct in the last steps' training rollouts; ASTER).
The training set is filtered once, before the first step (``data.integer_answers_only``,
``data.drop_overlong_prompts``; counts logged every step). With ``rl.tis_cap`` the batch keeps
the sampler's log-probs as ``behaviour_logprobs`` for the off-policy loss.
Checkpoints hold the TrainState plus the loop position (stage, steps done, data iterator
state, hard subset, weight version, collapse-monitor history), so a resumed run continues with
the same step, data position and stage.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from collections.abc import Sequence
from typing import Any, Protocol

import jax
import numpy as np

from rstar_jax.config import RunConfig, StageConfig
from rstar_jax.data import filters as data_filters
from rstar_jax.data.iterator import EpochIterator
from rstar_jax.data.problems import Problem, load_problems
from rstar_jax.distributed import hostdata, primary
from rstar_jax.errors import UserError
from rstar_jax.learner import batch as batch_lib
from rstar_jax.learner import packing
from rstar_jax.learner import steps as steps_lib
from rstar_jax.learner.batch import length_bucket
from rstar_jax.learner.checkpoint import Checkpointer
from rstar_jax.learner.train_state import reset_optimizer
from rstar_jax.pipelines import eval_protocols, rl_metrics
from rstar_jax.pipelines import stages as stages_lib
from rstar_jax.pipelines.agent_runner import (
  AgentRunner,
  RolloutSettings,
  eval_settings,
  rollout_settings,
)
from rstar_jax.pipelines.metrics_log import MetricsWriter, Progress
from rstar_jax.pipelines.runtime import Learner
from rstar_jax.rewards import quality
from rstar_jax.rl import selection as selection_lib

log = logging.getLogger(__name__)


class EmptyTrainingSet(UserError, ValueError):
  """No training problem is left after the filters: the launcher prints one line."""


class WeightTransfer(Protocol):
  """Where the push stage sends the new policy (an engine, or a transport in front of one)."""

  async def update_weights(self, model_config, params, version: int) -> Any: ...


@dataclasses.dataclass
class Rollouts:
  """Output of the rollout stage: ``groups[i][j]`` is sample j of ``problems[i]`` (each
  `Trajectory` records the weight version of every token)."""

  problems: list[Problem]
  groups: list[list[Any]]
  seed0: int
  select_key: jax.Array
  retries: int
  time_s: float
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)  # async RL: async/*
  generated: int = 0  # trajectories generated this step, summed over processes


@dataclasses.dataclass
class Scores:
  """Output of the score stage: [P, N] float32 host arrays."""

  rewards: np.ndarray
  penalties: np.ndarray
  time_s: float


@dataclasses.dataclass
class Selected:
  """Output of the select stage: the pure selection (host arrays) and the kept trajectories
  in batch order (group-major, kept index ascending)."""

  selection: selection_lib.Selection
  trajectories: list[Any]
  advantages: list[float]
  rewards: list[float]


async def collect_rollouts(
  runner,
  problems: Sequence[Problem],
  n: int,
  seed0: int,
  settings: RolloutSettings,
  *,
  max_retries: int,
  progress: Progress | None = None,
  stats: dict | None = None,
) -> tuple[list[list[Any]], int]:
  """``n`` trajectories per problem; each failed rollout is retried with the same seed.

  A rollout "fails" when the engine or agent loop raises, or when a tool call ended with
  ``internal_error`` (the pool lost its worker: not the policy's fault, so the sample would be
  biased). After ``max_retries`` failed attempts of one rollout this raises.
  With several JAX processes each rolls out its contiguous share of the problems
  (`hostdata.local_indices`) and every process gets every trajectory (an all-gather).
  Returns (groups [P][n], number of retries summed over processes); ``stats["generated"]``
  (when given) is set to the trajectories generated, summed over processes.
  """
  # [multi-process] this process rolls out its share of the prompts only.
  jobs = [(i, j) for i in hostdata.local_indices(len(problems)) for j in range(n)]
  if progress:
    progress.total = len(jobs)
  out: dict[tuple[int, int], Any] = {}
  retries = 0

  async def one(i, j):
    nonlocal retries
    seed = (seed0 + i * 7_368_787 + j * 104_729) % (2**31 - 1)
    last_err = None
    for attempt in range(max_retries + 1):
      try:
        traj = await runner.rollout(problems[i], seed=seed, settings=settings)
      except Exception as e:  # engine/agent failure: retry the same rollout
        last_err = e
        log.warning(
          "rollout (problem %d, sample %d) failed on attempt %d: %r", i, j, attempt + 1, e
        )
      else:
        if not any(c.status == "internal_error" for c in traj.tool_calls):
          out[(i, j)] = traj
          if progress:
            progress.update(len(out))
          return
        last_err = RuntimeError("tool call ended with internal_error (worker lost)")
        log.warning("rollout (problem %d, sample %d): tool worker lost; retrying", i, j)
      retries += 1
      await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
    raise RuntimeError(
      f"rollout of problem {i} sample {j} failed {max_retries + 1} times; last error: {last_err!r}"
    )

  await asyncio.gather(*(one(i, j) for i, j in jobs))
  # [multi-process] every process gets every trajectory; counts summed over processes.
  if stats is not None:
    stats["generated"] = int(hostdata.sum_over_processes(len(out)))
  retries = int(hostdata.sum_over_processes(retries))
  out = hostdata.allgather_dict(out)
  return [[out[(i, j)] for j in range(n)] for i in range(len(problems))], retries


def penalties_of(trajectories: Sequence[Any], p_err_mode: str, p_format_mode: str) -> np.ndarray:
  """p_err + p_format per trajectory, float32 [len(trajectories)]."""
  return np.asarray(
    [
      quality.p_err(
        [c.status for c in t.tool_calls], p_err_mode, [c.output_text for c in t.tool_calls]
      )
      + quality.p_format(t.response_text, max(1, t.num_turns), p_format_mode)
      for t in trajectories
    ],
    np.float32,
  )


@dataclasses.dataclass
class LoopPosition:
  """Everything besides the TrainState that a resumed run needs (stored as checkpoint JSON)."""

  rl_step: int = 0  # RL steps done over the run (skipped steps included)
  stage_index: int = 0
  stage_step: int = 0  # RL steps done in the current stage
  stage_started: bool = False  # stage-start actions (optimizer reset, hard subset) done
  data_source: str = "full"
  data_state: dict | None = None
  hard_indices: list[int] | None = None
  weight_version: int = 0
  collapse: dict | None = None
  hard_subset_stats: dict | None = None
  # Per RL step [(problem index, all rollouts correct)], newest last, for "recent" stages.
  recent_outcomes: list | None = None
  async_state: dict | None = None  # rl.max_staleness >= 1: groups issued, not yet trained on

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, d: dict) -> LoopPosition:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


class RLLoop:
  """Runs the RL stages of ``run`` on ``learner`` with ``runner`` (engine + tools + reward).

  Args:
    run: typed run config (mode "rl").
    learner: model, optimizer, jitted steps and live state (`runtime.build_learner`).
    runner: shared engine, code pool, tokenizer and reward (`agent_runner.AgentRunner`).
    workdir: checkpoints (``ckpt/``), metrics (``metrics.jsonl``, ``tb/``).
    problems: the training problems (default: ``run.data.train_path``).
    eval_problems: held-out problems evaluated every ``train.eval_every`` steps (optional).
    weight_transfer: the push stage's target (default: ``runner.engine``).
  """

  def __init__(
    self,
    run: RunConfig,
    learner: Learner,
    runner: AgentRunner,
    workdir: str,
    *,
    problems: Sequence[Problem] | None = None,
    eval_problems: Sequence[Problem] | None = None,
    weight_transfer: WeightTransfer | None = None,
  ):
    self.config = run
    self.learner = learner
    self.runner = runner
    self.weight_transfer = weight_transfer
    self.workdir = os.fspath(workdir)
    self.problems = list(problems) if problems is not None else load_problems(run.data.train_path)
    # A runner without prompt rendering (a test double) has no prompt to measure or refuse.
    prompt_length = getattr(runner, "prompt_length", None)
    self.problems, self.filter_counts = data_filters.filter_problems(
      self.problems,
      integer_answers_only=run.data.integer_answers_only,
      max_prompt_tokens=run.rollout.max_prompt_tokens
      if run.data.drop_overlong_prompts and prompt_length
      else 0,
      prompt_length=prompt_length,
    )
    if self.filter_counts["filter_kept"] < self.filter_counts["filter_total"]:
      log.info("training set filters: %s", self.filter_counts)
    if not self.problems:
      raise EmptyTrainingSet(
        f"RL loop: the training problem set is empty (filters: {self.filter_counts}); "
        "check data.train_path, or raise rollout.max_prompt_tokens when "
        "filter_dropped_overlong counts them all"
      )
    self.eval_problems = list(eval_problems) if eval_problems else []
    self.stages = list(run.stages)
    self._problem_index = {(p.problem, p.answer): i for i, p in enumerate(self.problems)}
    self._recent_window = max(
      [s.recent_steps for s in self.stages if s.data == "recent"], default=0
    )
    self.G = run.rl.group_size
    self.N = run.rl.oversample * self.G
    self.P = run.train.batch_prompts
    rm = learner.row_multiple
    self.rows = -(-self.P * self.G // rm) * rm
    self.collapse = rl_metrics.CollapseMonitor(window=run.rl.collapse_window)
    self.ckpt = Checkpointer(
      os.path.join(self.workdir, "ckpt"), max_to_keep=run.train.keep_checkpoints
    )
    self.pos = LoopPosition()
    self._last_saved_step = -1
    self.iterator: EpochIterator | None = None
    self.writer: MetricsWriter | None = None
    self.progress_every_s = run.train.progress_every_s
    # async RL hook (issue 19): None at rl.max_staleness == 0 (the synchronous loop)
    from rstar_jax.pipelines import async_rollout

    self.async_rl = async_rollout.from_config(run, runner)

  # ------------------------------------------------------------------ resume / checkpoint

  def restore_if_any(self) -> bool:
    """Restores the latest checkpoint in ``workdir/ckpt``; returns whether one was found.

    Steps that made no update (every group zero-variance) do not create an orbax checkpoint
    (its key is the optimizer step); their loop position and RNG are kept in the side file
    ``ckpt/loop_position.json``, used when it refers to the restored optimizer step.
    """
    if self.ckpt.latest_step() is None:
      return False
    state, meta = self.ckpt.restore(self.learner.state)
    self._last_saved_step = int(meta["step"])
    self.pos = LoopPosition.from_json(meta["loop"])
    side = self._read_side()
    if (
      side
      and side["optimizer_step"] == self._last_saved_step
      and side["loop"]["rl_step"] >= self.pos.rl_step
    ):
      self.pos = LoopPosition.from_json(side["loop"])
      rng = np.asarray(side["rng"], np.uint32)
      state = state.replace(rng=jax.device_put(rng, state.rng.sharding))
    self.learner.state = state
    if self.pos.collapse:
      self.collapse.load_state_dict(self.pos.collapse)
    self._make_iterator(self.pos.data_state)
    if self.async_rl is not None:  # async RL hook: groups in flight at the save come back
      self.async_rl.load_state_dict(self.pos.async_state)
    elif self.pos.async_state and self.pos.async_state["pending"]:
      log.warning(
        "resuming an asynchronous run (rl.max_staleness >= 1) synchronously: its %d "
        "in-flight prompt groups are skipped",
        len(self.pos.async_state["pending"]),
      )
    log.info(
      "resumed at RL step %d (stage %d, step %d in stage, weight version %d)",
      self.pos.rl_step,
      self.pos.stage_index,
      self.pos.stage_step,
      self.pos.weight_version,
    )
    return True

  @property
  def _side_path(self) -> str:
    return os.path.join(self.ckpt.directory, "loop_position.json")

  def _read_side(self) -> dict | None:
    try:
      with open(self._side_path, encoding="utf-8") as f:
        return json.load(f)
    except (OSError, ValueError):
      return None

  def save(self) -> bool:
    """Checkpoints the state (when it changed) and always the loop position side file."""
    self.pos.data_state = self.iterator.state_dict() if self.iterator else None
    self.pos.collapse = self.collapse.state_dict()
    if self.async_rl is not None:  # async RL hook: same instant as data_state (no await)
      self.pos.async_state = self.async_rl.state_dict()
    step = int(jax.device_get(self.learner.state.step))
    wrote = False
    if step != self._last_saved_step:
      wrote = bool(self.ckpt.save(self.learner.state, {"loop": self.pos.to_json()}, force=True))
      self._last_saved_step = step
      if primary.process_count() > 1:
        # [multi-process] commit before the next step: a process lost mid-step then never
        # takes the step's checkpoint with it (orbax finalises only when every process wrote).
        self.ckpt.wait_until_finished()
    side = {
      "optimizer_step": step,
      "loop": self.pos.to_json(),
      "rng": np.asarray(jax.device_get(self.learner.state.rng)).tolist(),
    }
    if primary.is_primary():  # [multi-process] one writer; the others read it on resume
      tmp = self._side_path + ".tmp"
      with open(tmp, "w", encoding="utf-8") as f:
        json.dump(side, f)
      os.replace(tmp, self._side_path)
    primary.sync("rl_loop.save")
    return wrote

  async def run(self, max_steps: int | None = None) -> dict:
    """Runs until every stage is done (or ``max_steps`` more RL steps); returns the last
    step's metrics."""
    resumed = self.restore_if_any()
    self.writer = MetricsWriter(
      self.workdir, "metrics", resume_step=self.pos.rl_step if resumed else None
    )
    if self.iterator is None:
      self._make_iterator(None)
    if resumed or self.pos.weight_version != self.runner.engine.weight_version:
      await self.push()
    last: dict = {}
    done = 0
    try:
      while self.pos.stage_index < len(self.stages):
        if max_steps is not None and done >= max_steps:
          break
        stage = self.stages[self.pos.stage_index]
        if not self.pos.stage_started:
          await self._start_stage(stage)
        last = await self.step(stage)
        done += 1
        self.pos.stage_step += 1
        self.pos.rl_step += 1
        if self.pos.stage_step >= stage.steps:
          self.pos.stage_index += 1
          self.pos.stage_step = 0
          self.pos.stage_started = False
        every = self.config.train.checkpoint_every
        if (every and self.pos.rl_step % every == 0) or self.pos.stage_index >= len(self.stages):
          self.save()
      self.save()
      self.ckpt.wait_until_finished()
    finally:
      if self.async_rl is not None:  # async RL hook: cancel what is in flight
        await self.async_rl.stop()
      self.writer.close()
    return last

  async def _start_stage(self, stage: StageConfig):
    log.info(
      "starting stage %d/%d %r: budget %d tokens, %d turns, data=%s",
      self.pos.stage_index + 1,
      len(self.stages),
      stage.name,
      stage.response_budget,
      stage.max_turns,
      stage.data,
    )
    if stage.reset_optimizer and self.pos.rl_step > 0:
      self.learner.state = reset_optimizer(self.learner.state)
      log.info("stage %r: optimizer state reset", stage.name)
    if stage.data in ("hard", "recent"):
      kept, stats = (
        (await self.hard_subset(stage)) if stage.data == "hard" else self.recent_subset(stage)
      )
      self.pos.hard_indices = kept
      self.pos.hard_subset_stats = stats
      self.pos.data_source = "hard"
      self._make_iterator(None)
    elif self.pos.data_source != "full":
      self.pos.data_source, self.pos.hard_indices = "full", None
      self._make_iterator(None)
    self.pos.stage_started = True

  async def hard_subset(self, stage: StageConfig) -> tuple[list[int], dict]:
    """Samples k rollouts per training problem with the current policy and keeps the indices
    of problems not solved k of k (`stages.build_hard_subset`)."""
    k = stage.drop_solved_k_of_k
    cap = self.config.rl.hard_subset_max_problems or len(self.problems)
    cand = list(range(min(cap, len(self.problems))))
    settings = rollout_settings(self.config, stage)
    seed0 = self.config.train.seed * 1_000_003 + 7919 * (self.pos.stage_index + 1)
    prog = Progress(f"hard-subset k={k}", len(cand) * k, every_s=self.progress_every_s)
    trajs, _ = await collect_rollouts(
      self.runner,
      [self.problems[i] for i in cand],
      k,
      seed0,
      settings,
      max_retries=self.config.rl.max_step_retries,
      progress=prog,
    )
    rewards = await self.verify(
      [t for g in trajs for t in g], [self.problems[i].answer for i in cand for _ in range(k)]
    )
    correct = np.asarray(rewards, np.float32).reshape(len(cand), k) > 0
    kept, stats = stages_lib.build_hard_subset(cand, correct.sum(1), k)
    kept += list(range(len(cand), len(self.problems)))  # never sampled: kept
    if not kept:
      raise RuntimeError(
        f"stage {stage.name!r}: every problem was solved {k} of {k}; the hard subset is empty"
      )
    log.info(
      "hard subset for %r: kept %d of %d candidates",
      stage.name,
      stats["hard_subset_kept"],
      stats["hard_subset_candidates"],
    )
    return kept, stats

  def recent_subset(self, stage: StageConfig) -> tuple[list[int], dict]:
    """The problems not all-correct at their latest appearance in the last
    ``stage.recent_steps`` RL steps' training rollouts (`stages.recent_unsolved_subset`)."""
    history = (self.pos.recent_outcomes or [])[-stage.recent_steps :]
    kept, stats = stages_lib.recent_unsolved_subset(len(self.problems), history)
    if not kept:
      raise RuntimeError(
        f"stage {stage.name!r}: every problem was all-correct in the recent "
        "rollouts; the subset is empty"
      )
    log.info(
      "recent-rollout subset for %r: dropped %d of %d seen problems",
      stage.name,
      stats["recent_dropped"],
      stats["recent_seen"],
    )
    return kept, stats

  def record_outcomes(self, ro: Rollouts, scores: Scores) -> None:
    """Remembers which of the step's problems were all-correct (for "recent" stages)."""
    if not self._recent_window:
      return
    step = [
      [self._problem_index[(p.problem, p.answer)], bool((scores.rewards[i] > 0).all())]
      for i, p in enumerate(ro.problems)
    ]
    self.pos.recent_outcomes = ((self.pos.recent_outcomes or []) + [step])[-self._recent_window :]

  def _dataset(self) -> list[Problem]:
    if self.pos.data_source == "hard":
      return [self.problems[i] for i in self.pos.hard_indices]
    return self.problems

  def _make_iterator(self, state: dict | None):
    items = self._dataset()
    if state is None:
      self.iterator = EpochIterator(items, seed=self.config.train.seed)
    else:
      self.iterator = EpochIterator.from_state(items, state)

  # ------------------------------------------------------------------ one step, stage by stage

  async def step(self, stage: StageConfig) -> dict:
    """One RL step: the stages of the module docstring, in order; returns its metrics."""
    t_start = time.monotonic()
    ro = await self.rollout(stage)
    scores = await self.score(ro)
    sel = self.select(ro, scores)
    self.record_outcomes(ro, scores)
    metrics = self.selection_metrics(ro, scores, sel)
    metrics.update(ro.metrics)
    t0 = time.monotonic()
    t_push = 0.0
    batch = self.build_batch(sel, metrics)
    if batch is not None:
      if self.async_rl is not None:  # async RL hook: rollouts go on during the update
        metrics.update(await asyncio.to_thread(self.update, batch, seed=ro.seed0 + 1))
      else:
        metrics.update(self.update(batch, seed=ro.seed0 + 1))
      t_update = time.monotonic() - t0
      t_push = await self.push(metrics)
    else:
      t_update = time.monotonic() - t0
      metrics["skipped_step"] = 1.0
      log.warning(
        "step %d: every group was all-correct or all-wrong; no update", self.pos.rl_step + 1
      )
    metrics["weight_version"] = self.pos.weight_version
    metrics["optimizer_step"] = int(jax.device_get(self.learner.state.step))
    metrics.update(
      time_rollout_s=ro.time_s,
      time_reward_s=scores.time_s,
      time_update_s=t_update,
      time_weight_push_s=t_push,
      time_step_s=time.monotonic() - t_start,
    )
    await self.log(stage, metrics)
    return metrics

  async def rollout(self, stage: StageConfig) -> Rollouts:
    """Next ``P`` problems, ``N`` trajectories each; splits the state's RNG for the step.
    At ``rl.max_staleness >= 1`` the groups come from the async producer (`async_rollout`),
    generated while earlier steps trained."""
    self.learner.state, key = self.learner.state.split_rng()
    k_seed, k_select = jax.random.split(key)
    seed0 = int(jax.random.randint(k_seed, (), 0, 2**31 - 1))
    t0 = time.monotonic()
    if self.async_rl is not None:  # async RL hook
      problems, groups, metrics = await self.async_rl.take(
        (self.pos.stage_index, self.pos.data_source),
        self.iterator,
        self._dataset(),
        rollout_settings(self.config, stage),
        stage.steps - self.pos.stage_step,
      )
      # The producer generates ahead; a step is charged with the groups it consumes.
      return Rollouts(
        problems,
        groups,
        seed0,
        k_select,
        int(metrics["async/rollout_retries"]),
        time.monotonic() - t0,
        metrics,
        generated=len(problems) * self.N,
      )
    problems = self.iterator.next_batch(self.P)
    prog = Progress(
      f"step {self.pos.rl_step + 1} rollouts", len(problems) * self.N, every_s=self.progress_every_s
    )
    stats: dict[str, int] = {}
    groups, retries = await collect_rollouts(
      self.runner,
      problems,
      self.N,
      seed0,
      rollout_settings(self.config, stage),
      max_retries=self.config.rl.max_step_retries,
      progress=prog,
      stats=stats,
    )
    return Rollouts(
      problems,
      groups,
      seed0,
      k_select,
      retries,
      time.monotonic() - t0,
      generated=stats["generated"],
    )

  async def verify(self, trajectories: Sequence[Any], answers: Sequence[str]) -> list[float]:
    """Outcome rewards, verified once: with several JAX processes each checks its contiguous
    share and the rewards are all-gathered, so no process decides alone (a timed-out check
    could otherwise differ between processes)."""
    return await hostdata.map_sharded(
      lambda part: self.runner.rewards([t for t, _ in part], [a for _, a in part]),
      list(zip(trajectories, answers)),
    )

  async def score(self, ro: Rollouts) -> Scores:
    """Outcome rewards and p_err + p_format penalties, [P, N] each."""
    t0 = time.monotonic()
    flat = rl_metrics.flatten(ro.groups)
    p, n = len(ro.problems), self.N
    rewards = np.asarray(
      await self.verify(flat, [q.answer for q in ro.problems for _ in range(n)]), np.float32
    ).reshape(p, n)
    rl = self.config.rl
    penalties = penalties_of(flat, rl.p_err_mode, rl.p_format_mode).reshape(p, n)
    return Scores(rewards, penalties, time.monotonic() - t0)

  def select(self, ro: Rollouts, scores: Scores) -> Selected:
    """`rstar_jax.rl.selection.select_rollouts` on the host arrays; the kept trajectories."""
    rl = self.config.rl
    sel = selection_lib.select_rollouts(
      ro.select_key,
      scores.rewards,
      scores.penalties,
      group_size=self.G,
      mode=rl.roc_mode,
      min_pos=rl.min_pos,
      min_neg=rl.min_neg,
      roc_eps=rl.roc_eps,
      drop_zero_variance=rl.drop_zero_variance,
      advantage=rl.advantage,
      adv_eps=rl.adv_eps,
      unbiased_std=rl.unbiased_std,
      neg_adv_scale=rl.neg_adv_scale,
    )
    sel = selection_lib.Selection(*(np.asarray(x) for x in sel))
    trajs, adv, rewards = [], [], []
    for g in np.flatnonzero(sel.keep_group):
      for j, col in enumerate(sel.indices[g]):
        trajs.append(ro.groups[g][col])
        adv.append(float(sel.advantages[g, j]))
        rewards.append(float(sel.rewards[g, j]))
    return Selected(sel, trajs, adv, rewards)

  def selection_metrics(self, ro: Rollouts, scores: Scores, sel: Selected) -> dict[str, Any]:
    """Trajectory, group-outcome, tool and selection statistics of the step."""
    flat = rl_metrics.flatten(ro.groups)
    r = scores.rewards
    keep = sel.selection.keep_group
    metrics: dict[str, Any] = {
      "stage": self.pos.stage_index,
      "stage_step": self.pos.stage_step,
      "rl_step": self.pos.rl_step + 1,
      "rollout_retries": float(ro.retries),
      "rollouts_generated": float(ro.generated),  # summed over processes
      "groups_kept": float(keep.sum()),
      "groups_total": float(len(ro.problems)),
    }
    metrics.update(rl_metrics.group_outcome_metrics(r))
    metrics.update({k: float(v) for k, v in self.filter_counts.items()})
    metrics.update(rl_metrics.trajectory_metrics(flat, r.reshape(-1)))
    metrics.update(rl_metrics.trajectory_metrics(sel.trajectories, sel.rewards, prefix="kept_"))
    metrics.update(rl_metrics.tool_latency_metrics(flat))
    metrics["penalty_pos_mean"] = float(scores.penalties[r > 0].mean()) if (r > 0).any() else 0.0
    return metrics

  def build_batch(
    self, sel: Selected, metrics: dict[str, Any] | None = None
  ) -> dict[str, np.ndarray] | None:
    """The fixed-shape host batch of the kept trajectories (None when nothing was kept),
    packed several per row with ``train.pack_rows`` and ``rl.loss_agg="token-mean"``
    (`rstar_jax.learner.packing`); the padding fractions before/after go into ``metrics``."""
    if not sel.trajectories:
      return None
    longest = max(len(t.prompt_ids) + len(t.response_ids) for t in sel.trajectories)
    pad_to = length_bucket(longest, self.config.train.length_bucket)
    batch = batch_lib.make_rl_batch(
      sel.trajectories, sel.advantages, pad_to, pad_id=self.runner.pad_id, row_multiple=self.rows
    )
    if self.config.rl.tis_cap:  # off-policy loss: the sampler's log-probs are the behaviour's
      batch[steps_lib.BEHAVIOUR_KEY] = batch["old_logprobs"].copy()
    if self.config.train.pack_rows and self.config.rl.loss_agg == "token-mean":
      batch, pack_metrics = packing.pack_for_step(
        batch, row_multiple=self.learner.row_multiple, pad_id=self.runner.pad_id
      )
      if metrics is not None:
        metrics.update(pack_metrics)
    return batch

  def update(self, batch: dict[str, np.ndarray], *, seed: int) -> dict[str, float]:
    """Old-log-prob recompute (``rl.recompute_old_logprobs``) and the step's PPO updates:
    ``rl.ppo_epochs`` passes over ``rl.ppo_mini_batches`` shuffled mini-batches of one fixed
    shape (old log-probs from the params before the first). Returns the updates' mean metrics."""
    js, rl = self.learner.jitted, self.config.rl
    sharded = js.shard_batch(batch)
    metrics: dict[str, float] = {}
    if rl.recompute_old_logprobs:
      lp = js.compute_logprobs(self.learner.state.params, sharded)
      sharded = steps_lib.with_old_logprobs(sharded, lp)
      lp = hostdata.to_host(lp)  # [multi-process] rows spread over processes: gathered
      drift = steps_lib.logprob_drift(batch["old_logprobs"], lp, batch["loss_mask"])
      metrics["sampler_logprob_drift"] = float(drift["logprob_abs_diff"])
      if self.async_rl is not None:  # async RL hook: behaviour (sampler) vs proximal log-probs
        batch, sharded = self.async_rl.with_behaviour_logprobs(batch, sharded, lp, metrics)
      batch = dict(batch, old_logprobs=lp * batch["loss_mask"])
    m, epochs = rl.ppo_mini_batches, rl.ppo_epochs
    if m == 1 and epochs == 1:
      updates = [sharded]
    else:
      rm = self.learner.row_multiple
      per_mb = -(-batch["input_ids"].shape[0] // m)  # packed batches have fewer rows
      rows = -(-per_mb // rm) * rm
      rng = np.random.default_rng(seed)
      updates = [
        js.shard_batch(mb)
        for _ in range(epochs)
        for mb in batch_lib.split_rl_batch(batch, m, rng, rows=rows, pad_id=self.runner.pad_id)
      ]
    sums: dict[str, float] = {}
    for mb in updates:
      self.learner.state, out = js.rl_step(self.learner.state, mb)
      for k, v in jax.device_get(out).items():  # mean over the step's updates
        sums[k] = (sums[k] if k in sums else 0.0) + float(v) / len(updates)
    metrics.update(sums)
    metrics["ppo_updates"] = float(len(updates))
    metrics["batch_rows"] = float(batch["input_ids"].shape[0])
    metrics["batch_len"] = batch["input_ids"].shape[1]
    return metrics

  async def push(self, metrics: dict[str, Any] | None = None) -> float:
    """Sends the current params to the weight transfer; returns the seconds it took.

    With ``metrics``, adds the target's ``push_metrics`` of this push (SGLang transports:
    ``push/bytes``, ``push/seconds``, ``push/gbps``, ``push/delta_fraction``)."""
    t0 = time.monotonic()
    version = int(jax.device_get(self.learner.state.step))
    target = self.weight_transfer or self.runner.engine
    params = hostdata.local_params(self.learner.params_copy())  # [multi-process] host copy
    await target.update_weights(self.learner.model_config, params, version)
    self.pos.weight_version = version
    if metrics is not None:
      metrics.update(getattr(target, "push_metrics", None) or {})
    return time.monotonic() - t0

  async def log(self, stage: StageConfig, metrics: dict[str, Any]) -> None:
    """Collapse monitor, held-out evaluation when due, then metrics.jsonl / TB and a log line."""
    metrics["collapse_warning"] = float(self.collapse.update(metrics["tool_calls_per_traj"]))
    every = self.config.train.eval_every
    if self.eval_problems and every and (self.pos.rl_step + 1) % every == 0:
      from rstar_jax.pipelines.evaluation import evaluate

      rep = await evaluate(
        self.runner,
        self.eval_problems,
        eval_settings(self.config),
        k=eval_protocols.resolve(self.config.eval).k,
        seed=self.config.eval.seed,
        progress_every_s=self.progress_every_s,
      )
      metrics.update({f"eval_{k}": v for k, v in rep["metrics"].items()})
    self.writer.write(self.pos.rl_step + 1, metrics)
    log.info(
      "step %d [%s]: reward %.3f, kept groups %d/%d, tool calls/traj %.2f, "
      "times rollout %.1fs reward %.1fs update %.1fs push %.1fs",
      self.pos.rl_step + 1,
      stage.name,
      metrics["reward_mean"],
      int(metrics["groups_kept"]),
      int(metrics["groups_total"]),
      metrics["tool_calls_per_traj"],
      metrics["time_rollout_s"],
      metrics["time_reward_s"],
      metrics["time_update_s"],
      metrics["time_weight_push_s"],
    )


# --------------------------------------------------------------------------- entry point


def run_rl(
  run: RunConfig,
  workdir: str,
  *,
  problems=None,
  eval_problems=None,
  tokenizer=None,
  params=None,
  max_steps: int | None = None,
  engine=None,
) -> dict:
  """Builds everything from ``run`` (mode "rl") and runs (or resumes) the RL stages.

  Args:
    run: the typed config (`rstar_jax.config.from_config_dict(cfg, "rl")`).
    workdir: output folder (checkpoints, metrics, tokenizer of a from-scratch model).
    problems / eval_problems: override the config's data sources.
    tokenizer / params: override the config's model source (e.g. the SFT phase's result).
    max_steps: stop after this many RL steps in this call (the run can be resumed).
    engine: a ready engine (default: built from ``run.rollout``).
  Returns:
    summary dict: rl_step, stage_index, optimizer_step, weight_version, last metrics.
  """
  from rstar_jax.pipelines import agent_runner, data_sources, runtime

  os.makedirs(workdir, exist_ok=True)
  if problems is None:
    problems = data_sources.train_problems(run)
  if eval_problems is None and run.train.eval_every:
    eval_problems = data_sources.eval_problems(run)
  if tokenizer is None:
    tokenizer = data_sources.ensure_tokenizer(run, workdir, data_sources.tokenizer_corpus(problems))
  learner = runtime.build_learner(run, params=params)
  runtime.check_vocab(tokenizer, learner.model_config)

  async def main():
    async with agent_runner.open_runner(
      run,
      learner.model_config,
      hostdata.local_params(learner.params_copy()),  # [multi-process] host-local copy
      tokenizer,
      engine=engine,
    ) as runner:
      loop = RLLoop(run, learner, runner, workdir, problems=problems, eval_problems=eval_problems)
      last = await loop.run(max_steps=max_steps)
      loop.ckpt.close()
      return loop, last

  loop, last = asyncio.run(main())
  return {
    "rl_step": loop.pos.rl_step,
    "stage_index": loop.pos.stage_index,
    "optimizer_step": int(jax.device_get(learner.state.step)),
    "weight_version": loop.pos.weight_version,
    "data_state": loop.pos.data_state,
    "hard_subset_stats": loop.pos.hard_subset_stats,
    "last_metrics": last,
    "learner": learner,
    "tokenizer": tokenizer,
  }
