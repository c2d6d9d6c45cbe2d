"""The GRPO-RoC training loop (SPEC §1.2 order of operations, §6.3 stages, §8 ASTER).

One RL step:
  1. take ``train.batch_prompts`` problems from the resumable iterator;
  2. roll out ``rl.oversample * rl.group_size`` trajectories per problem through the shared
     engine + agent loop + code pool (asyncio; failed rollouts are retried, so a failing
     engine call or a killed tool worker never loses the step's data);
  3. rewards (math verification, out of process with a timeout: it never hangs the loop);
  4. penalties p_err + p_format per trajectory;
  5. zero-variance filter (all-correct / all-wrong groups dropped, counted in the metrics);
  6. RoC down-sampling to G per group ("random" = plain GRPO: uniform down-sampling);
  7. GRPO advantages on the kept G;
  8. a fixed-shape padded batch: always ``batch_prompts * G`` rows (empty rows weigh 0) and a
     power-of-two length bucket, so the jitted step compiles once per bucket;
  9. optional old-log-prob recompute, then ``rl_step``;
 10. weight push to the engine (``update_weights``, version = optimizer step).

Stages: each stage sets the response budget and turn limit; a stage may reset the optimizer and
train on the hard subset (problems the policy at the stage start does not solve k of k).
Checkpoints hold the TrainState plus the loop position (stage, steps done, data iterator
state, hard subset, weight version, collapse-monitor history), so a resumed run continues with
the same step, data position and stage.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import os
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rstar_jax.data.iterator import EpochIterator
from rstar_jax.data.problems import Problem, load_problems
from rstar_jax.learner import batch as batch_lib
from rstar_jax.learner import packing
from rstar_jax.learner import steps as steps_lib
from rstar_jax.learner.checkpoint import Checkpointer
from rstar_jax.learner.train_state import reset_optimizer
from rstar_jax.pipelines import rl_metrics, stages as stages_lib
from rstar_jax.pipelines.agent_runner import AgentRunner, RolloutSettings
from rstar_jax.pipelines.metrics_log import MetricsWriter, Progress
from rstar_jax.pipelines.runtime import Learner, length_bucket  # noqa: F401 (re-export)
from rstar_jax.rewards import quality
from rstar_jax.rl import advantages as adv_lib
from rstar_jax.rl import roc as roc_lib

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- pure selection


def select_rollouts(key: jax.Array, rewards: np.ndarray, penalties: np.ndarray, *,
                    group_size: int, mode: str, min_pos: int, min_neg: int, eps: float,
                    drop_zero_variance: bool) -> tuple[np.ndarray, np.ndarray]:
  """Zero-variance filter + down-sampling of each group's N rollouts to G.

  Args:
    key: PRNG key.
    rewards, penalties: [P, N] float (N = oversample * G).
    mode: "paper" | "released" (RoC) or "random" (uniform down-sampling, plain GRPO).
  Returns:
    idx: [P, G] int32 kept rollout indices per group (ascending).
    keep_group: [P] bool, False for groups dropped by the zero-variance filter.
  """
  rewards = np.asarray(rewards, np.float32)
  p, n = rewards.shape
  if drop_zero_variance:
    keep = np.asarray(roc_lib.informative_groups(jnp.asarray(rewards)))
  else:
    keep = np.ones((p,), bool)
  if n == group_size:
    return np.tile(np.arange(n, dtype=np.int32), (p, 1)), keep
  if mode == "random":
    keys = jax.random.split(key, p)
    idx = jax.vmap(lambda k: jnp.sort(jax.random.permutation(k, n)[:group_size]))(keys)
  else:
    idx = _roc_jit(group_size, mode, min_pos, min_neg, float(eps))(
        key, jnp.asarray(rewards), jnp.asarray(penalties, jnp.float32))
  return np.asarray(idx, np.int32), keep


@functools.lru_cache(maxsize=None)
def _roc_jit(group_size, mode, min_pos, min_neg, eps):
  return jax.jit(functools.partial(roc_lib.roc_downsample, group_size=group_size, mode=mode,
                                   min_pos=min_pos, min_neg=min_neg, eps=eps))


def group_advantages(selected_rewards: np.ndarray, keep_group: np.ndarray, *, eps: float,
                     unbiased_std: bool, neg_scale: float = 1.0) -> np.ndarray:
  """GRPO advantages [P, G] on the kept rollouts; dropped groups get 0 (static shapes);
  negative ones multiplied by ``neg_scale`` (``rl.neg_adv_scale``)."""
  valid = np.broadcast_to(np.asarray(keep_group, bool)[:, None], selected_rewards.shape)
  adv = adv_lib.grpo_advantages(jnp.asarray(selected_rewards, jnp.float32), eps=eps,
                                unbiased_std=unbiased_std, valid=jnp.asarray(valid))
  if neg_scale != 1.0:
    adv = adv_lib.scale_negative_advantages(adv, neg_scale)
  return np.asarray(adv)


# --------------------------------------------------------------------------- the loop


@dataclasses.dataclass
class LoopPosition:
  """Everything besides the TrainState that a resumed run needs (stored as checkpoint JSON)."""

  rl_step: int = 0                  # RL steps done over the run (skipped steps included)
  stage_index: int = 0
  stage_step: int = 0               # RL steps done in the current stage
  stage_started: bool = False       # stage-start actions (optimizer reset, hard subset) done
  data_source: str = "full"
  data_state: dict | None = None
  hard_indices: list[int] | None = None
  weight_version: int = 0
  collapse: dict | None = None
  hard_subset_stats: dict | None = None

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, d: dict) -> "LoopPosition":
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


class RLLoop:
  """Runs the RL stages of ``config`` on ``learner`` with ``runner`` (engine + tools + reward).

  Args:
    config: validated run config (mode "rl").
    learner: model, optimizer, jitted steps and live state (`runtime.build_learner`).
    runner: shared engine, code pool, tokenizer and reward (`agent_runner.AgentRunner`).
    workdir: checkpoints (``ckpt/``), metrics (``metrics.jsonl``, ``tb/``).
    problems: the training problems (default: ``config.data.train_path``).
    eval_problems: held-out problems evaluated every ``train.eval_every`` steps (optional).
  """

  def __init__(self, config: ml_collections.ConfigDict, learner: Learner, runner: AgentRunner,
               workdir: str, *, problems: Sequence[Problem] | None = None,
               eval_problems: Sequence[Problem] | None = None):
    self.cfg = config
    self.learner = learner
    self.runner = runner
    self.workdir = os.fspath(workdir)
    self.problems = list(problems) if problems is not None else \
        load_problems(config.data.train_path)
    if not self.problems:
      raise ValueError("RL loop: the training problem set is empty")
    self.eval_problems = list(eval_problems) if eval_problems else []
    self.stages = stages_lib.stages_from_config(list(config.stages))
    rl = config.rl
    self.G = int(rl.group_size)
    self.N = int(rl.oversample) * self.G
    self.P = int(config.train.batch_prompts)
    rm = learner.row_multiple
    self.rows = -(-self.P * self.G // rm) * rm
    self.max_retries = int(rl.get("max_step_retries", 3))
    self.collapse = rl_metrics.CollapseMonitor(window=int(rl.get("collapse_window", 5)))
    self.ckpt = Checkpointer(os.path.join(self.workdir, "ckpt"),
                             max_to_keep=int(config.train.keep_checkpoints))
    self.pos = LoopPosition()
    self._last_saved_step = -1
    self.iterator: EpochIterator | None = None
    self.writer: MetricsWriter | None = None
    self.progress_every_s = float(config.train.get("progress_every_s", 10.0))

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
    if side and side["optimizer_step"] == self._last_saved_step and \
        side["loop"]["rl_step"] >= self.pos.rl_step:
      self.pos = LoopPosition.from_json(side["loop"])
      rng = np.asarray(side["rng"], np.uint32)
      state = state.replace(rng=jax.device_put(rng, state.rng.sharding))
    self.learner.state = state
    if self.pos.collapse:
      self.collapse.load_state_dict(self.pos.collapse)
    self._make_iterator(self.pos.data_state)
    log.info("resumed at RL step %d (stage %d, step %d in stage, weight version %d)",
             self.pos.rl_step, self.pos.stage_index, self.pos.stage_step,
             self.pos.weight_version)
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
    step = int(jax.device_get(self.learner.state.step))
    wrote = False
    if step != self._last_saved_step:
      wrote = bool(self.ckpt.save(self.learner.state, {"loop": self.pos.to_json()}, force=True))
      self._last_saved_step = step
    side = {"optimizer_step": step, "loop": self.pos.to_json(),
            "rng": np.asarray(jax.device_get(self.learner.state.rng)).tolist()}
    tmp = self._side_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(side, f)
    os.replace(tmp, self._side_path)
    return wrote

  def _dataset(self) -> list[Problem]:
    if self.pos.data_source == "hard":
      return [self.problems[i] for i in self.pos.hard_indices]
    return self.problems

  def _make_iterator(self, state: dict | None):
    items = self._dataset()
    if state is None:
      self.iterator = EpochIterator(items, seed=int(self.cfg.train.seed))
    else:
      self.iterator = EpochIterator.from_state(items, state)

  # ------------------------------------------------------------------ run

  async def run(self, max_steps: int | None = None) -> dict:
    """Runs until every stage is done (or ``max_steps`` more RL steps); returns the last
    step's metrics."""
    resumed = self.restore_if_any()
    self.writer = MetricsWriter(self.workdir, "metrics",
                                resume_step=self.pos.rl_step if resumed else None)
    if self.iterator is None:
      self._make_iterator(None)
    if resumed or self.pos.weight_version != self.runner.engine.weight_version:
      await self._push_weights()
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
        every = int(self.cfg.train.checkpoint_every)
        if (every and self.pos.rl_step % every == 0) or self.pos.stage_index >= len(self.stages):
          self.save()
      self.save()
      self.ckpt.wait_until_finished()
    finally:
      self.writer.close()
    return last

  async def _start_stage(self, stage: stages_lib.Stage):
    log.info("starting stage %d/%d %r: budget %d tokens, %d turns, data=%s",
             self.pos.stage_index + 1, len(self.stages), stage.name, stage.response_budget,
             stage.max_turns, stage.data)
    if stage.reset_optimizer and self.pos.rl_step > 0:
      self.learner.state = reset_optimizer(self.learner.state)
      log.info("stage %r: optimizer state reset", stage.name)
    if stage.data == "hard":
      kept, stats = await self.hard_subset(stage)
      self.pos.hard_indices = kept
      self.pos.hard_subset_stats = stats
      self.pos.data_source = "hard"
      self._make_iterator(None)
    elif self.pos.data_source != "full":
      self.pos.data_source, self.pos.hard_indices = "full", None
      self._make_iterator(None)
    self.pos.stage_started = True

  async def hard_subset(self, stage: stages_lib.Stage) -> tuple[list[int], dict]:
    """Samples k rollouts per training problem with the current policy and keeps the indices
    of problems not solved k of k (`stages.build_hard_subset`)."""
    k = stage.drop_solved_k_of_k
    cap = int(self.cfg.rl.get("hard_subset_max_problems", 0)) or len(self.problems)
    cand = list(range(min(cap, len(self.problems))))
    settings = self._settings(stage)
    seed0 = int(self.cfg.train.seed) * 1_000_003 + 7919 * (self.pos.stage_index + 1)
    prog = Progress(f"hard-subset k={k}", len(cand) * k, every_s=self.progress_every_s)
    trajs = await self._rollouts([self.problems[i] for i in cand], k, seed0, settings, prog)
    rewards = await self.runner.rewards(
        [t for g in trajs for t in g],
        [self.problems[i].answer for i in cand for _ in range(k)])
    correct = np.asarray(rewards, np.float32).reshape(len(cand), k) > 0
    kept, stats = stages_lib.build_hard_subset(cand, correct.sum(1), k)
    kept += list(range(len(cand), len(self.problems)))   # never sampled: kept
    if not kept:
      raise RuntimeError(f"stage {stage.name!r}: every problem was solved {k} of {k}; the hard "
                         "subset is empty")
    log.info("hard subset for %r: kept %d of %d candidates", stage.name, stats["hard_subset_kept"],
             stats["hard_subset_candidates"])
    return kept, stats

  def _settings(self, stage: stages_lib.Stage) -> RolloutSettings:
    r = self.cfg.rollout
    return RolloutSettings(response_budget=stage.response_budget, max_turns=stage.max_turns,
                           temperature=float(r.temperature), top_p=float(r.top_p),
                           top_k=int(r.top_k), max_tool_calls=int(r.max_tool_calls),
                           max_parallel_calls=int(r.max_parallel_calls))

  async def _rollouts(self, problems: Sequence[Problem], n: int, seed0: int,
                      settings: RolloutSettings, progress: Progress | None
                      ) -> list[list[Any]]:
    """``n`` trajectories per problem; each failed rollout is retried with the same seed.

    A rollout "fails" when the engine or agent loop raises, or when a tool call ended with
    ``internal_error`` (the pool lost its worker: not the policy's fault, so the sample would
    be biased). After ``rl.max_step_retries`` failed attempts of one rollout the step raises.
    """
    jobs = [(i, j) for i in range(len(problems)) for j in range(n)]
    out: dict[tuple[int, int], Any] = {}
    self._retries = 0

    async def one(i, j):
      seed = (seed0 + i * 7_368_787 + j * 104_729) % (2**31 - 1)
      last_err = None
      for attempt in range(self.max_retries + 1):
        try:
          traj = await self.runner.rollout(problems[i], seed=seed, settings=settings)
        except Exception as e:  # engine/agent failure: retry the same rollout
          last_err = e
          log.warning("rollout (problem %d, sample %d) failed on attempt %d: %r", i, j,
                      attempt + 1, e)
        else:
          if not any(c.status == "internal_error" for c in traj.tool_calls):
            out[(i, j)] = traj
            if progress:
              progress.update(len(out))
            return
          last_err = RuntimeError("tool call ended with internal_error (worker lost)")
          log.warning("rollout (problem %d, sample %d): tool worker lost; retrying", i, j)
        self._retries += 1
        await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
      raise RuntimeError(f"rollout of problem {i} sample {j} failed {self.max_retries + 1} "
                         f"times; last error: {last_err!r}")

    await asyncio.gather(*(one(i, j) for i, j in jobs))
    return [[out[(i, j)] for j in range(n)] for i in range(len(problems))]

  def _updates(self, batch: dict, sharded: dict, rng: np.random.Generator) -> list[dict]:
    """The step's PPO updates: ``rl.ppo_epochs`` passes over ``rl.ppo_mini_batches`` shuffled
    mini-batches of one fixed shape (old log-probs come from the params before the first)."""
    rl = self.cfg.rl
    m, epochs = int(rl.get("ppo_mini_batches", 1)), int(rl.get("ppo_epochs", 1))
    if m == 1 and epochs == 1:
      return [sharded]
    rm = self.learner.row_multiple
    per_mb = -(-batch["input_ids"].shape[0] // m)   # packed batches have fewer rows
    rows = -(-per_mb // rm) * rm
    js = self.learner.jitted
    return [js.shard_batch(mb) for _ in range(epochs)
            for mb in batch_lib.split_rl_batch(batch, m, rng, rows=rows,
                                               pad_id=self.runner.pad_id)]

  async def _push_weights(self) -> float:
    t0 = time.monotonic()
    version = int(jax.device_get(self.learner.state.step))
    await self.runner.engine.update_weights(self.learner.model_config,
                                            self.learner.params_copy(), version)
    self.pos.weight_version = version
    return time.monotonic() - t0

  async def step(self, stage: stages_lib.Stage) -> dict:
    """One RL step (module docstring); returns and logs its metrics."""
    cfg, rl = self.cfg, self.cfg.rl
    t_start = time.monotonic()
    problems = self.iterator.next_batch(self.P)
    self.learner.state, key = self.learner.state.split_rng()
    k_seed, k_roc = jax.random.split(key)
    seed0 = int(jax.random.randint(k_seed, (), 0, 2**31 - 1))
    settings = self._settings(stage)

    # 2. rollouts
    t0 = time.monotonic()
    prog = Progress(f"step {self.pos.rl_step + 1} rollouts", len(problems) * self.N,
                    every_s=self.progress_every_s)
    groups = await self._rollouts(problems, self.N, seed0, settings, prog)
    t_rollout = time.monotonic() - t0

    # 3-4. rewards and penalties
    t0 = time.monotonic()
    flat = rl_metrics.flatten(groups)
    rewards = np.asarray(await self.runner.rewards(
        flat, [p.answer for p in problems for _ in range(self.N)]), np.float32)
    rewards = rewards.reshape(len(problems), self.N)
    penalties = np.asarray([
        quality.p_err([c.status for c in t.tool_calls], rl.p_err_mode,
                      [c.output_text for c in t.tool_calls])
        + quality.p_format(t.response_text, max(1, t.num_turns), rl.p_format_mode)
        for t in flat], np.float32).reshape(len(problems), self.N)
    t_reward = time.monotonic() - t0

    # 5-7. zero-variance filter, RoC, advantages
    idx, keep = select_rollouts(
        k_roc, rewards, penalties, group_size=self.G, mode=rl.roc_mode,
        min_pos=int(rl.min_pos), min_neg=int(rl.min_neg), eps=float(rl.roc_eps),
        drop_zero_variance=bool(rl.drop_zero_variance))
    sel_rewards = np.take_along_axis(rewards, idx, axis=1)
    adv = group_advantages(sel_rewards, keep, eps=float(rl.adv_eps),
                           unbiased_std=bool(rl.unbiased_std),
                           neg_scale=float(rl.get("neg_adv_scale", 1.0)))
    kept_trajs, kept_adv, kept_rewards = [], [], []
    for g in np.flatnonzero(keep):
      for j, col in enumerate(idx[g]):
        kept_trajs.append(groups[g][col])
        kept_adv.append(float(adv[g, j]))
        kept_rewards.append(float(sel_rewards[g, j]))

    metrics: dict[str, Any] = {
        "stage": self.pos.stage_index, "stage_step": self.pos.stage_step,
        "rl_step": self.pos.rl_step + 1, "rollout_retries": float(self._retries),
        "groups_kept": float(keep.sum()), "groups_total": float(len(problems)),
    }
    metrics.update(rl_metrics.group_outcome_metrics(rewards))
    metrics.update(rl_metrics.trajectory_metrics(flat, rewards.reshape(-1)))
    metrics.update(rl_metrics.trajectory_metrics(kept_trajs, kept_rewards, prefix="kept_"))
    metrics.update(rl_metrics.tool_latency_metrics(flat))
    metrics["penalty_pos_mean"] = float(penalties[rewards > 0].mean()) if (rewards > 0).any() \
        else 0.0

    # 8-9. batch and update
    t0 = time.monotonic()
    t_push = 0.0
    if kept_trajs:
      longest = max(len(t.prompt_ids) + len(t.response_ids) for t in kept_trajs)
      pad_to = length_bucket(longest, int(cfg.train.get("length_bucket", 64)))
      batch = batch_lib.make_rl_batch(kept_trajs, kept_adv, pad_to,
                                      pad_id=self.runner.pad_id, row_multiple=self.rows)
      if cfg.train.get("pack_rows", True) and rl.get("loss_agg", "token-mean") == "token-mean":
        batch, pack_metrics = packing.pack_for_step(batch, row_multiple=self.learner.row_multiple,
                                                    pad_id=self.runner.pad_id)
        metrics.update(pack_metrics)
      js = self.learner.jitted
      sharded = js.shard_batch(batch)
      if rl.recompute_old_logprobs:
        lp = js.compute_logprobs(self.learner.state.params, sharded)
        sharded = steps_lib.with_old_logprobs(sharded, lp)
        lp = np.asarray(lp)
        metrics["sampler_logprob_drift"] = _drift(batch, lp)
        batch = dict(batch, old_logprobs=lp * batch["loss_mask"])
      updates = self._updates(batch, sharded, np.random.default_rng(seed0 + 1))
      for mb in updates:
        self.learner.state, m = js.rl_step(self.learner.state, mb)
        m = jax.device_get(m)
        for k, v in m.items():   # mean over the step's updates
          metrics[k] = metrics.get(k, 0.0) + float(v) / len(updates)
      metrics["ppo_updates"] = float(len(updates))
      metrics["batch_rows"], metrics["batch_len"] = float(batch["input_ids"].shape[0]), pad_to
      t_update = time.monotonic() - t0
      # 10. weight push
      t_push = await self._push_weights()
    else:
      t_update = time.monotonic() - t0
      metrics["skipped_step"] = 1.0
      log.warning("step %d: every group was all-correct or all-wrong; no update",
                  self.pos.rl_step + 1)
    metrics["weight_version"] = self.pos.weight_version
    metrics["optimizer_step"] = int(jax.device_get(self.learner.state.step))
    metrics.update(time_rollout_s=t_rollout, time_reward_s=t_reward, time_update_s=t_update,
                   time_weight_push_s=t_push, time_step_s=time.monotonic() - t_start)
    metrics["collapse_warning"] = float(self.collapse.update(metrics["tool_calls_per_traj"]))

    if self.eval_problems and int(cfg.train.eval_every) and \
        (self.pos.rl_step + 1) % int(cfg.train.eval_every) == 0:
      from rstar_jax.pipelines.evaluation import evaluate
      rep = await evaluate(self.runner, self.eval_problems, eval_settings(cfg),
                           k=int(cfg.eval.k), seed=int(cfg.eval.get("seed", 0)),
                           progress_every_s=self.progress_every_s)
      metrics.update({f"eval_{k}": v for k, v in rep["metrics"].items()})

    self.writer.write(self.pos.rl_step + 1, metrics)
    log.info("step %d [%s]: reward %.3f, kept groups %d/%d, tool calls/traj %.2f, "
             "times rollout %.1fs reward %.1fs update %.1fs push %.1fs",
             self.pos.rl_step + 1, stage.name, metrics["reward_mean"], int(keep.sum()),
             len(problems), metrics["tool_calls_per_traj"], t_rollout, t_reward, t_update,
             t_push)
    return metrics


def _drift(batch: dict, recomputed: np.ndarray) -> float:
  """Mean |sampler log-prob - learner log-prob| over loss tokens (sampler/trainer mismatch)."""
  mask = batch["loss_mask"] > 0
  if not mask.any():
    return 0.0
  return float(np.abs(batch["old_logprobs"][mask] - recomputed[mask]).mean())


def eval_settings(cfg: ml_collections.ConfigDict) -> RolloutSettings:
  e, r = cfg.eval, cfg.rollout
  return RolloutSettings(response_budget=int(e.response_budget), max_turns=int(e.max_turns),
                         temperature=float(e.temperature), top_p=float(e.top_p),
                         top_k=int(r.top_k), max_tool_calls=int(r.max_tool_calls),
                         max_parallel_calls=int(r.max_parallel_calls))


# --------------------------------------------------------------------------- entry point


def run_rl(config: ml_collections.ConfigDict, workdir: str, *, problems=None,
           eval_problems=None, tokenizer=None, params=None, max_steps: int | None = None,
           engine=None) -> dict:
  """Validates ``config``, builds everything and runs (or resumes) the RL stages.

  Args:
    config: an RL config (``mode == "rl"``).
    workdir: output folder (checkpoints, metrics, tokenizer of a from-scratch model).
    problems / eval_problems: override the config's data sources.
    tokenizer / params: override the config's model source (e.g. the SFT phase's result).
    max_steps: stop after this many RL steps in this call (the run can be resumed).
    engine: a ready engine (default: built from ``config.rollout``).
  Returns:
    summary dict: rl_step, stage_index, optimizer_step, weight_version, last metrics.
  """
  from rstar_jax.pipelines import agent_runner, data_sources, runtime
  from rstar_jax.pipelines.config_validation import validate_config
  validate_config(config, "rl", check_paths=True)
  os.makedirs(workdir, exist_ok=True)
  if problems is None:
    problems = data_sources.train_problems(config)
  if eval_problems is None and int(config.train.eval_every):
    eval_problems = data_sources.eval_problems(config)
  if tokenizer is None:
    tokenizer = data_sources.ensure_tokenizer(
        config, workdir, data_sources.tokenizer_corpus(problems))
  learner = runtime.build_learner(config, params=params)
  runtime.check_vocab(tokenizer, learner.model_config)

  async def main():
    async with agent_runner.open_runner(config, learner.model_config, learner.params_copy(),
                                        tokenizer, engine=engine) as runner:
      loop = RLLoop(config, learner, runner, workdir, problems=problems,
                    eval_problems=eval_problems)
      last = await loop.run(max_steps=max_steps)
      loop.ckpt.close()
      return loop, last

  loop, last = asyncio.run(main())
  return {"rl_step": loop.pos.rl_step, "stage_index": loop.pos.stage_index,
          "optimizer_step": int(jax.device_get(learner.state.step)),
          "weight_version": loop.pos.weight_version, "data_state": loop.pos.data_state,
          "hard_subset_stats": loop.pos.hard_subset_stats, "last_metrics": last,
          "learner": learner, "tokenizer": tokenizer}
