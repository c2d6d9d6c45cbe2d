"""The GRPO-RoC training loop (rStar2-Agent's order of operations and stages; ASTER's GRPO).

`RLLoop.step` only sequences named stages, each a method a test can call alone (table and
data flow: ``pipelines/README.md``): take the step's groups from the `GroupSource` -> score
(rewards, p_err + p_format) -> select (`rl.selection`: zero-variance filter, RoC, advantages)
-> build_batch (fixed rows, length bucket, packed rows) -> update (the learner's batch contract
`learner.steps.step_inputs`, then ``rl.ppo_epochs`` x ``rl.ppo_mini_batches`` jitted steps)
-> push (one `WeightTransfer` call) -> log (held-out eval when due, metrics.jsonl / TB).
The pure parts live in `step_data`, `rstar_jax.rl` and `rstar_jax.learner`.

The step has no mode branches: choosing asynchronous RL is choosing the source
(`wiring.group_source`); the update always runs in a worker thread, so an asynchronous source
keeps generating meanwhile. Stages set the response budget and turn limit and may reset the
optimizer or train on the hard / "recent" subset (`stages`). Checkpoints hold the TrainState
plus the `loop_state.LoopPosition`, so a resumed run continues with the same step, data
position, stage and in-flight groups.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from rstar_jax.config import RunConfig, StageConfig, eval_protocols
from rstar_jax.data.iterator import EpochIterator
from rstar_jax.data.problems import Problem
from rstar_jax.distributed import hostdata
from rstar_jax.errors import CheckpointedStop
from rstar_jax.learner import batch as batch_lib
from rstar_jax.learner import packing
from rstar_jax.learner import routing_outliers as outliers_lib
from rstar_jax.learner import steps as steps_lib
from rstar_jax.learner.batch import length_bucket
from rstar_jax.learner.checkpoint import Checkpointer
from rstar_jax.learner.train_state import reset_optimizer
from rstar_jax.models import lora
from rstar_jax.pipelines import (
  data_sources,
  loop_state,
  metrics_log,
  rl_metrics,
  step_data,
  trajectory_ledger,
  wiring,
)
from rstar_jax.pipelines import stages as stages_lib
from rstar_jax.pipelines.evaluation import evaluate
from rstar_jax.pipelines.loop_state import LoopPosition
from rstar_jax.pipelines.metrics_log import MetricsWriter, Progress
from rstar_jax.pipelines.step_data import Rollouts, Scores, Selected
from rstar_jax.pipelines.wiring import Learner
from rstar_jax.rollout.agent_runner import AgentRunner
from rstar_jax.rollout.sources import GroupSource, StageFeed, SyncSource, WeightTransfer

log = logging.getLogger(__name__)
# Routing-outlier records: rows recomputed per step at most (each costs two forwards).
_OUTLIER_ROWS = 8


class RLLoop:
  """Runs the RL stages of ``run`` on ``learner`` with ``runner`` (engine + tools + reward).

  Args:
    run: typed run config (mode "rl").
    learner: model, optimizer, jitted steps and live state (`wiring.build_learner`).
    runner: shared engine, code pool, tokenizer and reward (`rollout.agent_runner.AgentRunner`).
    workdir: checkpoints (``ckpt/``), metrics (``metrics.jsonl``, ``tb/``).
    problems: the training problems (default: ``run.data.train_path``).
    eval_problems: held-out problems evaluated every ``train.eval_every`` steps (optional).
    weight_transfer: the push stage's target (default: ``source.engine``).
    source: where the step's groups come from (default: `wiring.group_source`, by
      ``rl.max_staleness``).
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
    source: GroupSource | None = None,
  ):
    self.config = run
    self.learner = learner
    self.runner = runner
    self.weight_transfer = weight_transfer
    self.workdir = os.fspath(workdir)
    self._evictions_seen = 0  # the engine's eviction count at the last logged step
    if problems is None:  # dataset hook (issue 32): JSONL / parquet / datasets dir
      problems = data_sources.train_problems(run)
    self.problems, self.filter_counts = wiring.training_set(run, problems, runner)
    self.eval_problems = list(eval_problems) if eval_problems else []
    self.stages = list(run.stages)
    self._problem_index = {(p.problem, p.answer): i for i, p in enumerate(self.problems)}
    self._recent_window = max(
      [s.recent_steps for s in self.stages if s.data == "recent"], default=0
    )
    self.G, self.P = run.rl.group_size, run.train.batch_prompts
    self.N = run.rl.oversample * self.G
    rm = learner.row_multiple
    self.rows = -(-self.P * self.G // rm) * rm
    self.collapse = rl_metrics.CollapseMonitor(window=run.rl.collapse_window)
    self.ckpt = Checkpointer(
      os.path.join(self.workdir, "ckpt"),
      max_to_keep=run.train.keep_checkpoints,
      enable_async=run.train.async_checkpoints,
    )
    self.pos = LoopPosition()
    self._last_saved_step = -1
    self.iterator: EpochIterator | None = None
    self.writer: MetricsWriter | None = None
    self.ledger: trajectory_ledger.LedgerWriter | None = None
    self.progress_every_s = run.train.progress_every_s
    self.source = source or wiring.group_source(run, runner, on_start=self._progress_ticker)

  def _progress_ticker(self, total: int):
    label = f"step {self.pos.rl_step + 1} rollouts"
    return Progress(label, total, every_s=self.progress_every_s).update

  # ------------------------------------------------------------------ resume / checkpoint

  def restore_if_any(self) -> bool:
    """Restores the latest checkpoint in ``workdir/ckpt`` (`loop_state.restore`: a step that
    made no update left its position and RNG in the side file); returns whether one was found."""
    got = loop_state.restore(self.ckpt, self.learner.state)
    if got is None:
      return False
    self.learner.state, self.pos, self._last_saved_step = got
    if self.pos.collapse:
      self.collapse.load_state_dict(self.pos.collapse)
    self._make_iterator(self.pos.data_state)
    self.source.load_state_dict(self.pos.source_state)  # async: groups in flight come back
    log.info(
      "resumed at RL step %d (stage %d, step %d in stage, weight version %d)",
      self.pos.rl_step,
      self.pos.stage_index,
      self.pos.stage_step,
      self.pos.weight_version,
    )
    return True

  def snapshot(self) -> tuple:
    """What `save` would write now (state, position, data and source states), to write later
    with `save(snapshot)`."""
    pos = copy.deepcopy(self.pos)
    pos.data_state = self.iterator.state_dict() if self.iterator else None
    pos.collapse = self.collapse.state_dict()
    pos.source_state = self.source.state_dict()  # same instant as data_state (no await)
    return self.learner.state, pos

  def save(self, snapshot: tuple | None = None) -> bool:
    """Checkpoints the state (when it changed) and always the loop position side file;
    ``snapshot`` (`snapshot`): an earlier instant instead of now."""
    if snapshot is None:
      snapshot = self.snapshot()
    state, self.pos = snapshot
    self.learner.state = state
    wrote, self._last_saved_step = loop_state.save(
      self.ckpt, self.learner.state, self.pos, self._last_saved_step
    )
    return wrote

  async def run(self, max_steps: int | None = None) -> dict:
    """Runs until every stage is done (or ``max_steps`` more RL steps); returns the last
    step's metrics."""
    resumed = self.restore_if_any()
    self.writer = MetricsWriter(
      self.workdir,
      "metrics",
      resume_step=self.pos.rl_step if resumed else None,
      **metrics_log.sink_options(self.config, self.workdir, "rl"),  # W&B hook (issue 32)
    )
    if self.config.log.trajectory_ledger:
      self.ledger = trajectory_ledger.LedgerWriter(
        self.workdir, self.pos.rl_step if resumed else None
      )
    if self.iterator is None:
      self._make_iterator(None)
    if resumed or self.pos.weight_version != self.source.engine.weight_version:
      await self.push()
    last: dict = {}
    done = 0
    try:
      while self.pos.stage_index < len(self.stages) and (max_steps is None or done < max_steps):
        stage = self.stages[self.pos.stage_index]
        if not self.pos.stage_started:
          await self._start_stage(stage)
        before = self.snapshot()  # immutable arrays and copies: cheap
        try:
          last = await self.step(stage)
        except CheckpointedStop:
          # An outside failure (every rollout server gone): checkpoint the instant the step
          # started from (state, data position, groups in flight), so a rerun redoes this
          # step exactly, then stop.
          self.save(before)
          self.ckpt.wait_until_finished()
          log.error("RL step %d stopped; checkpoint written", self.pos.rl_step + 1)
          raise
        done += 1
        self.pos.advance(stage.steps)
        every = self.config.train.checkpoint_every
        if (every and self.pos.rl_step % every == 0) or self.pos.stage_index >= len(self.stages):
          self.save()
      self.save()
      self.ckpt.wait_until_finished()
    finally:
      await self.source.close()  # async: cancels what is in flight
      self.writer.close()
      if self.ledger is not None:
        self.ledger.close()
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
    if stage.data == "hard":  # k rollouts per training problem with the current policy
      k, every = stage.drop_solved_k_of_k, self.progress_every_s
      source = SyncSource(
        self.runner,
        num_samples=k,
        max_retries=self.config.rl.max_step_retries,
        on_start=lambda n: Progress(f"hard-subset k={k}", n, every_s=every).update,
      )
      kept, stats = await stages_lib.hard_subset(
        self.problems,
        stage,
        source,
        self.verify,
        seed=self.config.train.seed * 1_000_003 + 7919 * (self.pos.stage_index + 1),
        settings=wiring.rollout_settings(self.config, stage, tokenizer=self.runner.tokenizer),
        max_problems=self.config.rl.hard_subset_max_problems,
      )
    elif stage.data == "recent":
      kept, stats = stages_lib.recent_subset(len(self.problems), stage, self.pos.recent_outcomes)
    if stage.data in ("hard", "recent"):
      self.pos.hard_indices, self.pos.hard_subset_stats = kept, stats
      self.pos.data_source = "hard"
      self._make_iterator(None)
    elif self.pos.data_source != "full":
      self.pos.data_source, self.pos.hard_indices = "full", None
      self._make_iterator(None)
    self.pos.stage_started = True

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
    metrics_log.log_rollout_samples(  # sample-rollout hook (issue 32)
      self.writer,
      self.config.log,
      self.pos.rl_step + 1,
      ro.problems,
      ro.groups,
      scores.rewards,
      tokenizer=self.runner.tokenizer,  # the rendered prompt, as the policy saw it
    )
    sel = self.select(ro, scores)
    self.record_outcomes(ro, scores)
    metrics = self.selection_metrics(ro, scores, sel)
    metrics.update(ro.metrics)
    fleet = getattr(self.source.engine, "fleet_metrics", None)  # SGLang: servers, failovers
    if fleet is not None:
      metrics.update(fleet())
    # The embedded sampler drops kept prefixes when short of KV pages; their next turn
    # re-prefills and re-reports routes (docs/routing_replay.md), so runs exposed to it show here.
    evictions = getattr(self.source.engine, "evictions", None)
    if isinstance(evictions, int):
      metrics["rollout/prefix_evictions"] = float(evictions - self._evictions_seen)
      self._evictions_seen = evictions
    t0 = time.monotonic()
    t_push = 0.0
    batch = self.build_batch(sel, metrics)
    if batch is not None:
      # In a worker thread (JAX releases the GIL): an asynchronous source generates meanwhile.
      labels = self.row_labels(ro, sel) if "segment_ids" not in batch else None
      metrics.update(
        await asyncio.to_thread(self.update, batch, seed=ro.seed0 + 1, row_labels=labels)
      )
      t_update = time.monotonic() - t0
      t_push = await self.push(metrics)
    else:
      t_update = time.monotonic() - t0
      metrics["skipped_step"] = 1.0
      log.warning(
        "step %d: every group was all-correct or all-wrong; no update", self.pos.rl_step + 1
      )
    if self.ledger is not None:  # after the update: the row names what it trained
      self.ledger.write(self.ledger_row(ro, sel))
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
    """The step's ``P`` groups of ``N`` trajectories from the source; splits the state's RNG
    for the step (its seed and the selection key)."""
    self.learner.state, key = self.learner.state.split_rng()
    k_seed, k_select = jax.random.split(key)
    seed0 = int(jax.random.randint(k_seed, (), 0, 2**31 - 1))
    t0 = time.monotonic()
    feed = StageFeed(
      key=(self.pos.stage_index, self.pos.data_source),
      iterator=self.iterator,
      dataset=self._dataset(),
      settings=wiring.rollout_settings(self.config, stage, tokenizer=self.runner.tokenizer),
      steps_left=stage.steps - self.pos.stage_step,
    )
    got = await self.source.take(self.P, seed=seed0, feed=feed)
    t = time.monotonic() - t0
    return Rollouts(
      got.problems,
      got.groups,
      seed0,
      k_select,
      got.retries,
      t,
      got.metrics,
      got.generated,
      ids=got.ids,
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
    penalties = step_data.penalties_of(flat, rl.p_err_mode, rl.p_format_mode).reshape(p, n)
    return Scores(rewards, penalties, time.monotonic() - t0)

  def select(self, ro: Rollouts, scores: Scores) -> Selected:
    """`rstar_jax.rl.selection.select_rollouts` on the host arrays; the kept trajectories."""
    return step_data.select(ro, scores, self.config.rl)

  def ledger_row(self, ro: Rollouts, sel: Selected) -> dict[str, Any]:
    """The step's `trajectory_ledger` row: the groups taken and the (group, sample) trained."""
    keep, cols = np.asarray(sel.selection.keep_group), np.asarray(sel.selection.indices)
    kept = [(int(g), int(c)) for g in np.flatnonzero(keep) for c in cols[g]]
    ids = ro.ids if ro.ids is not None else [(-1, -1)] * len(ro.problems)
    problems = [self._problem_index.get((p.problem, p.answer), -1) for p in ro.problems]
    return trajectory_ledger.step_row(self.pos.rl_step + 1, problems, ids, kept)

  def row_labels(self, ro: Rollouts, sel: Selected) -> list[dict[str, int]]:
    """What each row of the unpacked batch is: the (group, sample) of its trajectory in the
    step's rollouts, and the problem's dataset index (-1 when unknown)."""
    keep, cols = np.asarray(sel.selection.keep_group), np.asarray(sel.selection.indices)
    out = []
    for g in np.flatnonzero(keep):
      p = ro.problems[int(g)]
      problem = self._problem_index.get((p.problem, p.answer), -1)
      out += [{"group": int(g), "sample": int(c), "problem": problem} for c in cols[g]]
    return out

  def selection_metrics(self, ro: Rollouts, scores: Scores, sel: Selected) -> dict[str, Any]:
    """Trajectory, group-outcome, tool and selection statistics of the step, with its place."""
    metrics: dict[str, Any] = {
      "stage": self.pos.stage_index,
      "stage_step": self.pos.stage_step,
      "rl_step": self.pos.rl_step + 1,
    }
    metrics.update({k: float(v) for k, v in self.filter_counts.items()})
    metrics.update(step_data.selection_metrics(ro, scores, sel))
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
    if self.config.train.pack_rows and self.config.rl.loss_agg == "token-mean":
      batch, pack_metrics = packing.pack_for_step(
        batch, row_multiple=self.learner.row_multiple, pad_id=self.runner.pad_id
      )
      if metrics is not None:
        metrics.update(pack_metrics)
    return batch

  def update(
    self, batch: dict[str, np.ndarray], *, seed: int, row_labels: list | None = None
  ) -> dict[str, float]:
    """Old-log-prob recompute (``rl.recompute_old_logprobs``) and the step's PPO updates:
    ``rl.ppo_epochs`` passes over ``rl.ppo_mini_batches`` shuffled mini-batches of one fixed
    shape (old log-probs from the params before the first). Returns the updates' mean metrics.
    ``row_labels``: what each batch row is, for routing-outlier records (`routing_outliers`)."""
    js, rl = self.learner.jitted, self.config.rl
    proximal = None
    if rl.recompute_old_logprobs:  # under routing replay with the recorded routes forced
      lp = js.compute_logprobs(self.learner.state.params, js.shard_batch(batch))
      proximal = hostdata.to_host(lp)  # [multi-process] rows spread over processes: gathered
    routing, lps = {}, {}
    if batch_lib.ROUTES_KEY in batch:
      lps = self.routing_logprobs(batch, proximal)
      if rl.routing_metrics:
        routing = self.routing_ratio_metrics(batch, lps)
      if rl.routing_outlier_band > 0:
        routing.update(self.routing_outliers(batch, lps, row_labels))
    # The learner's batch contract: old / behaviour log-probs and their metrics.
    batch, metrics = steps_lib.step_inputs(
      batch, js.config, proximal, older_weights=self.source.off_policy
    )
    metrics.update(routing)
    m, epochs = rl.ppo_mini_batches, rl.ppo_epochs
    if m == 1 and epochs == 1:
      updates = [js.shard_batch(batch)]
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

  def routing_logprobs(self, batch, proximal) -> dict[str, np.ndarray]:
    """MoE routing replay: the learner's [N, T] log-probs the routing diagnostics compare with
    the sampler's: ``replay`` (engine routes forced; under ``rl.routing_replay``) and ``own``
    (the learner's own routing; only with ``rl.routing_metrics``, unless it is the recomputed
    old log-probs). Reuses ``proximal`` where it is the wanted forward; otherwise one extra
    forward each."""
    js, params = self.learner.jitted, self.learner.state.params

    def logprobs(with_routes: bool):
      b = batch if with_routes else {k: v for k, v in batch.items() if k != batch_lib.ROUTES_KEY}
      return hostdata.to_host(js.compute_logprobs(params, js.shard_batch(b)))

    replay = js.config.routing_replay
    out = {}
    if replay and (proximal is not None or self.config.rl.routing_metrics):
      out["replay"] = proximal if proximal is not None else logprobs(True)
    if not replay and proximal is not None:
      out["own"] = proximal
    elif self.config.rl.routing_metrics:
      out["own"] = logprobs(False)
    return out

  def routing_ratio_metrics(self, batch, lps: dict[str, np.ndarray]) -> dict[str, float]:
    """Sampler-vs-learner importance ratios (`batch.ratio_stats`) of `routing_logprobs`:
    ``routing/replay/*`` (engine routes replayed) and ``routing/no_replay/*`` (own routing)."""
    sampler, mask = batch[batch_lib.SAMPLER_KEY], batch["loss_mask"]
    out = {}
    if "replay" in lps:
      out.update(batch_lib.ratio_stats(sampler, lps["replay"], mask, "routing/replay/"))
    if "own" in lps:
      out.update(batch_lib.ratio_stats(sampler, lps["own"], mask, "routing/no_replay/"))
    return out

  def routing_outliers(self, batch, lps: dict[str, np.ndarray], row_labels=None) -> dict:
    """Issue 39: tokens whose ratio in ``lps`` leaves ``rl.routing_outlier_band`` get a record
    in ``<workdir>/routing_outliers.jsonl`` (`rstar_jax.learner.routing_outliers`; only the rows
    holding one are recomputed). Returns ``routing/outlier_tokens`` (flagged this step) and
    ``routing/outlier_checked`` (loss tokens checked)."""
    band = self.config.rl.routing_outlier_band
    mask = np.asarray(batch["loss_mask"]) > 0
    mask[:, :1] = False
    flagged = outliers_lib.flag(batch[batch_lib.SAMPLER_KEY], batch["loss_mask"], band, lps)
    n = int(flagged.sum())
    metrics = {
      "routing/outlier_tokens": float(n),
      "routing/outlier_checked": float(mask.sum()) if lps else 0.0,
    }
    if not n:
      return metrics
    rows = [int(r) for r in np.flatnonzero(flagged.any(1))][:_OUTLIER_ROWS]
    params = lora.merged_copy(self.learner.state.params)  # plain tree, survives the step
    diag = outliers_lib.diagnose_rows(params, self.learner.model_config, batch, rows)
    tok = getattr(self.runner, "tokenizer", None)
    recs = outliers_lib.records(
      step=self.pos.rl_step + 1,
      batch=batch,
      flagged=flagged,
      diag=diag,
      rows=rows,
      learner_logprobs=lps,
      band=band,
      row_labels=row_labels,
      decode=None if tok is None else tok.decode,
    )
    if jax.process_index() == 0:
      outliers_lib.save_rows(self.workdir, self.pos.rl_step + 1, batch, rows, lps)
      path = outliers_lib.write(self.workdir, recs)
      log.warning(
        "step %d: %d token(s) with an importance ratio outside [1/%g, %g]; %d record(s) in %s",
        self.pos.rl_step + 1,
        n,
        band,
        band,
        len(recs),
        path,
      )
    return metrics

  async def push(self, metrics: dict[str, Any] | None = None) -> float:
    """Sends the current params to the weight transfer; returns the seconds it took.

    With ``metrics``, adds the target's ``push_metrics`` of this push (SGLang transports:
    ``push/bytes``, ``push/seconds``, ``push/gbps``, ``push/delta_fraction``)."""
    t0 = time.monotonic()
    version = int(jax.device_get(self.learner.state.step))
    target = self.weight_transfer or self.source.engine
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
      rep = await evaluate(
        self.runner,
        self.eval_problems,
        wiring.eval_settings(self.config, tokenizer=self.runner.tokenizer),
        k=eval_protocols.resolve(self.config.eval).k,
        seed=self.config.eval.seed,
        progress_every_s=self.progress_every_s,
      )
      metrics.update({f"eval_{k}": v for k, v in rep["metrics"].items()})
    self.writer.write(self.pos.rl_step + 1, metrics)
    m = metrics
    log.info(
      f"step {self.pos.rl_step + 1} [{stage.name}]: reward {m['reward_mean']:.3f}, kept groups "
      f"{int(m['groups_kept'])}/{int(m['groups_total'])}, tool calls/traj "
      f"{m['tool_calls_per_traj']:.2f}, times rollout {m['time_rollout_s']:.1f}s reward "
      f"{m['time_reward_s']:.1f}s update {m['time_update_s']:.1f}s push "
      f"{m['time_weight_push_s']:.1f}s"
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
  problems, eval_problems, tokenizer, learner = wiring.rl_setup(
    run, workdir, problems=problems, eval_problems=eval_problems, tokenizer=tokenizer, params=params
  )

  async def main():
    async with wiring.open_runner(
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
