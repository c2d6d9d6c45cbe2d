"""The RL loop with rl.max_staleness = 1 on a tiny model, the real JaxSampler and code pool:
rollouts overlap the update (worker thread), a resume mid-overlap regenerates the groups that
were in flight, the data position stays exact, the batch carries behaviour and proximal
log-probs, and the per-step async metrics are logged. k = 0 leaves the loop as it was."""

import asyncio
import collections
import dataclasses

import jax
import numpy as np
import pytest

from configs import rstar2_tiny_cpu
from rstar_jax.config import from_config_dict
from rstar_jax.data import synthetic_tasks
from rstar_jax.data.iterator import EpochIterator
from rstar_jax.pipelines import data_sources, rl_loop, wiring
from rstar_jax.pipelines.metrics_log import read_jsonl_metrics
from rstar_jax.rollout import agent_runner
from rstar_jax.rollout import groups as groups_lib
from rstar_jax.rollout.interruptible import InterruptibleEngine
from rstar_jax.rollout.sources import SyncSource


def _config(k, steps=3):
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.mesh.num_devices = 1
  cfg.train.batch_prompts = 2
  cfg.train.eval_every = 0
  cfg.train.checkpoint_every = 1
  cfg.rollout.response_budget = 12
  cfg.rollout.max_turns = 1
  cfg.rl.max_staleness = k
  cfg.stages = [
    dict(
      name="s",
      steps=steps,
      response_budget=12,
      max_turns=1,
      data="full",
      reset_optimizer=False,
      drop_solved_k_of_k=0,
    )
  ]
  return cfg


async def _alternating(trajs, answers):
  return [float(i % 2) for i in range(len(answers))]  # every group mixed: real updates


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  problems = synthetic_tasks.generate(3, 40, families=["mul"], difficulty="easy")[:5]
  cfg = from_config_dict(_config(1), "rl")
  tok = data_sources.ensure_tokenizer(
    cfg, str(tmp_path_factory.mktemp("tok")), data_sources.tokenizer_corpus(problems)
  )
  return problems, tok


def _run(cfg, workdir, problems, tok, max_steps):
  cfg = from_config_dict(cfg, "rl")
  learner = wiring.build_learner(cfg)
  seen, batches = [], []
  real_step = learner.jitted.rl_step

  def spy_step(state, mb):
    batches.append({k: np.asarray(v) for k, v in mb.items()})
    return real_step(state, mb)

  learner.jitted = dataclasses.replace(learner.jitted, rl_step=spy_step)

  class Recording(agent_runner.AgentRunner):
    # A subclass, not an instance patch: the asynchronous source rolls out through a copy of
    # the runner with its engine wrapped, which must still record.
    async def rollout(self, problem, *, seed, settings):
      seen.append((problem.problem, seed))
      return await super().rollout(problem, seed=seed, settings=settings)

  async def main():
    async with wiring.open_runner(
      cfg, learner.model_config, learner.params_copy(), tok, runner_cls=Recording
    ) as runner:
      runner.rewards = _alternating
      loop = rl_loop.RLLoop(cfg, learner, runner, str(workdir), problems=problems)
      await loop.run(max_steps=max_steps)
      loop.ckpt.close()
      return loop

  return asyncio.run(main()), seen, batches


@pytest.mark.slow
def test_async_loop_resumes_mid_overlap_with_exact_data_position(
  setup, tmp_path, metrics_doc_check
):
  problems, tok = setup
  cfg = _config(1)
  cfg.rl.tis_cap = 2.0  # the off-policy loss reads the sampler's log-probs: the batch has them
  n = cfg.rl.oversample * cfg.rl.group_size
  first, seen1, batches1 = _run(cfg, tmp_path, problems, tok, max_steps=1)
  assert isinstance(first.source.engine, InterruptibleEngine)
  assert not isinstance(first.runner.engine, InterruptibleEngine)  # wrapped, not swapped
  pending = first.pos.source_state["pending"]
  # While step 1 trained, the next step's groups (k * P = 2) were issued: still in flight.
  assert len(pending) == 2
  drawn = EpochIterator(problems, seed=0)
  drawn.next_batch(2 + len(pending))
  assert first.pos.data_state == drawn.state_dict()

  second, seen2, batches2 = _run(cfg, tmp_path, problems, tok, max_steps=None)
  assert second.pos.rl_step == 3 and second.pos.stage_index == 1
  # Every prompt of the stage trained exactly once: 3 steps x 2 prompts, the iterator's first 6.
  done = EpochIterator(problems, seed=0)
  done.next_batch(6)
  assert second.pos.data_state == done.state_dict()
  assert second.pos.source_state == {"pending": [], "next_seq": 6}
  # The groups in flight at the stop were regenerated first, with their recorded seeds.
  want = collections.Counter(
    (problems[i].problem, groups_lib.sample_seed(sd, j)) for _, i, sd in pending for j in range(n)
  )
  assert collections.Counter(seen2[: len(want)]) == want

  recs = read_jsonl_metrics(tmp_path / "metrics.jsonl")
  metrics_doc_check(recs)  # the async/ keys are in docs/metrics.md
  assert [r["step"] for r in recs] == [1, 2, 3]
  assert [r["optimizer_step"] for r in recs] == [1, 2, 3]
  for r in recs:
    tokens = sum(v for k, v in r.items() if k.startswith("async/lag_") and k.endswith("_tokens"))
    assert tokens > 0 and r.get("async/lag_2_tokens", 0.0) == 0.0
    for key in (
      "async/is_ratio_mean",
      "async/is_ratio_max",
      "async/is_truncated_frac",
      "async/dropped_stale_trajectories",
      "async/learner_idle_frac",
      "async/rollout_idle_frac",
    ):
      assert key in r, key
  # Step 3 trains on groups sampled by version 1 while version 2 trained on step 2's: lag 1.
  assert recs[-1]["async/lag_1_tokens"] > 0
  # The batch carries the sampler's (behaviour) log-probs next to the recomputed (proximal)
  # ones; they agree on lag-0 data and differ once the data is a push old.
  for b in batches1 + batches2:
    assert "behaviour_logprobs" in b and b["behaviour_logprobs"].shape == b["old_logprobs"].shape
    assert np.all(b["behaviour_logprobs"][b["loss_mask"] == 0] == 0)
  lag1 = batches2[-1]
  diff = np.abs(lag1["behaviour_logprobs"] - lag1["old_logprobs"])[lag1["loss_mask"] > 0]
  assert diff.max() > 1e-3
  assert recs[-1]["async/is_ratio_max"] != pytest.approx(1.0, abs=1e-4)


@pytest.mark.slow
def test_k0_is_the_synchronous_loop(setup, tmp_path):
  problems, tok = setup
  with_field = _config(0, steps=1)
  without = _config(0, steps=1)
  del without.rl["max_staleness"]
  a, _, batches_a = _run(with_field, tmp_path / "a", problems, tok, max_steps=None)
  b, _, batches_b = _run(without, tmp_path / "b", problems, tok, max_steps=None)
  assert isinstance(a.source, SyncSource) and a.source.engine is a.runner.engine
  assert not isinstance(a.runner.engine, InterruptibleEngine)
  assert a.pos.source_state == {} and "behaviour_logprobs" not in batches_a[0]
  for x, y in zip(jax.tree.leaves(a.learner.state.params), jax.tree.leaves(b.learner.state.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert batches_a[0].keys() == batches_b[0].keys()
