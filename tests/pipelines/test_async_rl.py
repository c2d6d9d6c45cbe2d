"""The asynchronous group source (rollout/async_source.py) against a simulated engine: issue cap,
staleness drops and regeneration, exact data position, resume mid-overlap, metrics."""

import asyncio
import collections

import numpy as np
import pytest

from rstar_jax.data.iterator import EpochIterator
from rstar_jax.data.problems import Problem
from rstar_jax.learner import batch as batch_lib
from rstar_jax.pipelines import wiring
from rstar_jax.rollout import async_source
from rstar_jax.rollout import groups as groups_lib
from rstar_jax.rollout.interruptible import InterruptibleEngine
from rstar_jax.rollout.sources import StageFeed, SyncSource
from rstar_jax.rollout.types import GenerateRequest, GenerateResult, SamplingParams, Trajectory

PROBLEMS = [Problem(problem=f"p{i}", answer=str(i)) for i in range(7)]
TOKENS = 4


class SimEngine:
  """Token by token, sleeping ``delay(problem, token index)`` before each; each token records
  the version it was produced with (weights swap between tokens, as the JaxSampler does)."""

  swaps_weights_in_flight = True

  def __init__(self, delay):
    self.delay, self._v, self._abort = delay, 0, set()

  @property
  def weight_version(self):
    return self._v

  async def update_weights(self, config, params, version=None):
    self._v = self._v + 1 if version is None else version

  async def abort(self, rid):
    self._abort.add(rid)
    return True

  async def generate(self, reqs):
    out = []
    for r in reqs:
      ids, vs = [], []
      for i in range(r.sampling.max_new_tokens):
        await asyncio.sleep(self.delay(r.rid.split("|")[0], i))
        if r.rid in self._abort:
          out.append(GenerateResult(ids, [0.0] * len(ids), "abort", min(vs, default=self._v), vs))
          break
        ids.append(len(ids) + 1)
        vs.append(self._v)
      else:
        out.append(GenerateResult(ids, [-0.5] * len(ids), "length", min(vs), vs))
    return out


class SimRunner:
  def __init__(self, engine):
    self.engine = engine
    self.seen = []  # (problem text, seed) of every rollout started

  async def rollout(self, problem, *, seed, settings):
    self.seen.append((problem.problem, seed))
    req = GenerateRequest([1, 2], SamplingParams(TOKENS), rid=f"{problem.problem}|{seed}:0")
    res = (await self.engine.generate([req]))[0]
    n = len(res.output_ids)
    return Trajectory(
      prompt_ids=[1, 2],
      response_ids=list(res.output_ids),
      loss_mask=[1] * n,
      logprobs=list(res.logprobs),
      weight_versions=res.token_versions(),
      num_turns=1,
      tool_calls=[],
      finish_reason=res.finish_reason,
    )


def _source(runner, k=1, P=2, N=2, mode="continue"):
  return async_source.AsyncSource(
    runner, max_staleness=k, partial_rollout=mode, num_samples=N, batch_prompts=P, base_seed=5
  )


async def _steps(src, iterator, n_steps, steps_left, update_s=0.02, key=0):
  """``n_steps`` learner steps: take, "update" (sleep), push. Returns taken problems/metrics."""
  taken, metrics = [], []
  for i in range(n_steps):
    got = await src.take(src.P, feed=StageFeed(key, iterator, PROBLEMS, None, steps_left - i))
    problems, groups, m = got.problems, got.groups, got.metrics
    assert len(problems) == src.P and all(len(g) == src.N for g in groups)
    taken += [p.problem for p in problems]
    metrics.append(m)
    await asyncio.sleep(update_s)
    await src.engine.update_weights(None, None, src.engine.weight_version + 1)
  return taken, metrics


def _prefix(n, seed=0):
  it = EpochIterator(PROBLEMS, seed=seed)
  return [p.problem for p in it.next_batch(n)]


def test_k_must_be_positive():
  with pytest.raises(ValueError, match="max_staleness: expected >= 1"):
    _source(SimRunner(SimEngine(lambda p, i: 0.0)), k=0)


def _run_config(**rl):
  from configs import rstar2_tiny_cpu
  from rstar_jax.config import from_config_dict

  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.train.batch_prompts = 2
  cfg.rl.oversample, cfg.rl.group_size, cfg.rl.min_pos, cfg.rl.min_neg = 2, 2, 1, 1
  for k, v in rl.items():
    setattr(cfg.rl, k, v)
  return from_config_dict(cfg, "rl")


def test_group_source_is_sync_at_k0_and_wraps_the_engine_at_k1():
  runner = SimRunner(SimEngine(lambda p, i: 0.0))
  raw = runner.engine
  run = _run_config(partial_rollout="restart", max_step_retries=1, tis_cap=3.0)
  assert run.rl.max_staleness == 0  # the default: the synchronous loop
  sync = wiring.group_source(run, runner)
  assert isinstance(sync, SyncSource) and sync.engine is raw and not sync.off_policy
  src = wiring.group_source(
    _run_config(max_staleness=1, partial_rollout="restart", max_step_retries=1, tis_cap=3.0), runner
  )
  # Wrapped, not swapped: the runner it was given (evaluation's) keeps the raw engine.
  assert runner.engine is raw and src.runner is not runner and src.runner.engine is src.engine
  assert isinstance(src.engine, InterruptibleEngine) and src.engine.inner is raw
  assert src.engine.mode == "restart" and src.N == 4 and src.capacity == 2 and src.off_policy
  assert src.max_retries == 1


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("max_staleness", -1, r"rl\.max_staleness"),
    ("partial_rollout", "resume", r"rl\.partial_rollout"),
    ("tis_cap", -0.5, r"rl\.tis_cap"),
  ],
)
def test_config_fields_are_checked(field, value, match):
  with pytest.raises(ValueError, match=match):
    _run_config(**{field: value})


def test_overlap_bounded_by_k_and_data_position_exact():
  runner = SimRunner(SimEngine(lambda p, i: 0.003))
  src = _source(runner, k=1)
  it = EpochIterator(PROBLEMS, seed=0)

  async def main():
    taken, metrics = await _steps(src, it, 5, steps_left=6)
    state = src.state_dict()
    await src.close()
    return taken, metrics, state

  taken, metrics, state = asyncio.run(main())
  pending = [PROBLEMS[i].problem for _, i, _ in state["pending"]]
  # Issued = trained + pending, exactly the iterator's first items: none lost, none twice.
  assert (
    state["next_seq"]
    == len(taken) + len(pending)
    == it.state_dict()["index"] + 7 * it.state_dict()["epoch"]
  )
  assert collections.Counter(taken + pending) == collections.Counter(
    _prefix(len(taken) + len(pending))
  )
  # k = 1: at most P groups ahead of the learner; their tokens lag 0 or 1 pushes, never 2.
  assert len(pending) <= src.capacity
  for m in metrics:
    assert (
      sum(v for k, v in m.items() if k.startswith("async/lag_") and k.endswith("_tokens"))
      == 2 * 2 * TOKENS
    )
    assert m.get("async/lag_2_tokens", 0.0) == 0.0
  assert any(m["async/lag_1_tokens"] > 0 for m in metrics[1:])  # the overlap happened
  assert all(0.0 <= m["async/learner_idle_frac"] <= 1.0 for m in metrics)
  assert all(0.0 <= m["async/rollout_idle_frac"] <= 1.0 for m in metrics)


def test_stale_group_is_dropped_counted_and_regenerated():
  slow = _prefix(1)[0]  # the first group drawn: its first token at once, then ~8 steps
  runner = SimRunner(SimEngine(lambda p, i: (0.08 if i else 0.0) if p == slow else 0.002))
  src = _source(runner, k=2, P=2, N=1)
  it = EpochIterator(PROBLEMS, seed=0)

  async def main():
    return await _steps(src, it, 5, steps_left=5)

  taken, metrics = asyncio.run(main())
  dropped = sum(m["async/dropped_stale_groups"] for m in metrics)
  assert dropped >= 1 and sum(m["async/dropped_stale_trajectories"] for m in metrics) >= 1
  # The slow prompt was regenerated (same seed) and trained on exactly once, nothing lost.
  assert taken.count(slow) == 1 and collections.Counter(taken) == collections.Counter(_prefix(10))
  assert [s for p, s in runner.seen if p == slow] == [
    groups_lib.sample_seed(async_source.group_seed(5, 0), 0)
  ] * (1 + int(dropped))
  for m in metrics:  # nothing trained beyond the bound
    assert all(
      v == 0
      for k, v in m.items()
      if k.startswith("async/lag_") and k.endswith("_tokens") and int(k.split("_")[1]) > 2
    )


def test_resume_mid_overlap_regenerates_in_flight_groups():
  seeds = {}

  async def first():
    runner = SimRunner(SimEngine(lambda p, i: 0.003))
    src = _source(runner, k=2)
    it = EpochIterator(PROBLEMS, seed=0)
    taken, _ = await _steps(src, it, 2, steps_left=5)
    # "Checkpoint" while groups are in flight, then the process dies.
    state, data = src.state_dict(), it.state_dict()
    assert state["pending"], "nothing was in flight: the test would not test the resume"
    await src.close()
    for p, s in runner.seen:
      seeds.setdefault(p, []).append(s)
    return taken, state, data

  async def second(state, data):
    runner = SimRunner(SimEngine(lambda p, i: 0.003))
    src = _source(runner, k=2)
    src.load_state_dict(state)
    it = EpochIterator.from_state(PROBLEMS, data)
    taken, _ = await _steps(src, it, 3, steps_left=3)
    end = src.state_dict()
    await src.close()
    return taken, runner.seen, end, it.state_dict()

  taken1, state, data = asyncio.run(first())
  taken2, seen2, end, data2 = asyncio.run(second(state, data))
  assert collections.Counter(taken1 + taken2) == collections.Counter(_prefix(10))
  assert end["pending"] == [] and data2 == EpochIterator.from_state(PROBLEMS, data2).state_dict()
  # The groups in flight at the checkpoint are generated first after the resume, with the
  # seeds they had: the same rollouts, not new draws.
  first_seen = seen2[: 2 * len(state["pending"])]
  want = [
    (PROBLEMS[i].problem, groups_lib.sample_seed(sd, j))
    for _, i, sd in state["pending"]
    for j in range(2)
  ]
  assert sorted(first_seen) == sorted(want)


def test_restart_mode_regenerates_trajectories_cut_by_a_push():
  runner = SimRunner(SimEngine(lambda p, i: 0.01))
  src = _source(runner, k=1, P=2, N=2, mode="restart")
  it = EpochIterator(PROBLEMS, seed=0)

  async def main():
    return await _steps(src, it, 3, steps_left=3, update_s=0.015)

  taken, metrics = asyncio.run(main())
  assert collections.Counter(taken) == collections.Counter(_prefix(6))
  assert sum(m["async/restarted_trajectories"] for m in metrics) > 0
  for m in metrics:  # a restarted trajectory is wholly on one version: no mixed lags
    assert m.get("async/lag_2_tokens", 0.0) == 0.0


def test_importance_metrics_match_numpy():
  rng = np.random.default_rng(0)
  b = rng.normal(-2, 0.5, (3, 6)).astype(np.float32)
  p = b + rng.normal(0, 0.8, (3, 6)).astype(np.float32)
  mask = (rng.random((3, 6)) > 0.3).astype(np.float32)
  m = batch_lib.importance_metrics(b, p, mask, cap=2.0)
  r = np.exp(p[mask > 0].astype(np.float64) - b[mask > 0])
  assert m["async/is_ratio_mean"] == pytest.approx(r.mean(), rel=1e-6)
  assert m["async/is_ratio_max"] == pytest.approx(r.max(), rel=1e-6)
  assert m["async/is_truncated_frac"] == pytest.approx((r > 2.0).mean())
  empty = batch_lib.importance_metrics(b, p, np.zeros_like(mask), cap=2.0)
  assert empty["async/is_ratio_mean"] == 1.0 and empty["async/is_truncated_frac"] == 0.0
  off = batch_lib.importance_metrics(b, p, mask, cap=0.0)  # rl.tis_cap = 0: no truncation
  assert off["async/is_truncated_frac"] == 0.0
  assert off["async/is_ratio_max"] == pytest.approx(r.max(), rel=1e-6)
