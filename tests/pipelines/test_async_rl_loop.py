"""The RL loop with rl.max_staleness = 1 on a tiny model, the real JaxSampler and code pool:
rollouts overlap the update (worker thread); a learner process killed with SIGKILL mid-overlap
and run again resumes from its last checkpoint, regenerates the groups that were in flight and
trains every issued group exactly once (the trajectory ledger shows it), with the data position
exact; the batch carries behaviour and proximal log-probs, and the per-step async metrics are
logged. k = 0 leaves the loop as it was."""

import asyncio
import collections
import dataclasses
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from configs import rstar2_tiny_cpu
from rstar_jax.config import from_config_dict
from rstar_jax.data import synthetic_tasks
from rstar_jax.data.iterator import EpochIterator
from rstar_jax.errors import complete_steps
from rstar_jax.learner.checkpoint import Checkpointer
from rstar_jax.pipelines import data_sources, loop_state, rl_loop, trajectory_ledger, wiring
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
  tok_dir = str(tmp_path_factory.mktemp("tok"))
  tok = data_sources.ensure_tokenizer(cfg, tok_dir, data_sources.tokenizer_corpus(problems))
  return problems, tok, os.path.join(tok_dir, "tokenizer")


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


# The learner process of the killed run: `_run` of this module on the same problems and tokenizer
# (argv: workdir, tokenizer dir), in a process of its own so that it can be SIGKILLed.
KILLED_LEARNER = """
import sys
sys.path.insert(0, {here!r})
import test_async_rl_loop as t
from rstar_jax.tokenization import bpe
cfg = t._config(1)
cfg.rl.tis_cap = 2.0
cfg.log.trajectory_ledger = True
problems = t.synthetic_tasks.generate(3, 40, families=["mul"], difficulty="easy")[:5]
t._run(cfg, sys.argv[1], problems, bpe.load_tokenizer(sys.argv[2]), max_steps=None)
"""


def _ledger_rows(workdir):
  try:
    return trajectory_ledger.read(os.path.join(workdir, trajectory_ledger.FILE))
  except OSError:
    return []


def _kill_in_step_2(workdir, tok_dir):
  """Starts the learner process and SIGKILLs it as soon as step 2 is in the ledger (its update
  made, its checkpoint usually still being written) with step 1's checkpoint complete; returns
  the ledger rows it had written."""
  code = KILLED_LEARNER.format(here=os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""))
  proc = subprocess.Popen(
    [sys.executable, "-c", code, str(workdir), tok_dir],
    cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),  # configs/
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    deadline = time.monotonic() + 600
    while not (complete_steps(os.path.join(workdir, "ckpt")) and len(_ledger_rows(workdir)) >= 2):
      assert proc.poll() is None, proc.communicate()[1][-3000:]
      assert time.monotonic() < deadline, "no checkpoint written"
      time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == -signal.SIGKILL, "the learner ended before the kill: nothing tested"
  return _ledger_rows(workdir)


@pytest.mark.slow
def test_a_killed_async_learner_resumes_and_trains_every_group_once(
  setup, tmp_path, metrics_doc_check
):
  problems, tok, tok_dir = setup
  cfg = _config(1)
  cfg.rl.tis_cap = 2.0  # the off-policy loss reads the sampler's log-probs: the batch has them
  cfg.log.trajectory_ledger = True
  n, P = cfg.rl.oversample * cfg.rl.group_size, cfg.train.batch_prompts
  killed_rows = _kill_in_step_2(tmp_path, tok_dir)

  # What the rerun resumes from: the last complete checkpoint (a write the kill cut is not).
  run = from_config_dict(cfg, "rl")
  _, at_ckpt, _ = loop_state.restore(
    Checkpointer(str(tmp_path / "ckpt")), wiring.build_learner(run).state
  )
  c = at_ckpt.rl_step
  assert 1 <= c < 3
  pending = at_ckpt.source_state["pending"]
  # While step c trained, the next step's groups (k * P = 2) were issued: in flight at the kill.
  assert [q for q, _, _ in pending] == [c * P, c * P + 1]
  drawn = EpochIterator(problems, seed=0)
  drawn.next_batch(c * P + len(pending))
  assert at_ckpt.data_state == drawn.state_dict()

  second, seen2, batches2 = _run(cfg, tmp_path, problems, tok, max_steps=None)
  assert second.pos.rl_step == 3 and second.pos.stage_index == 1
  # Every prompt of the stage trained exactly once: 3 steps x 2 prompts, the iterator's first 6.
  done = EpochIterator(problems, seed=0)
  done.next_batch(6)
  assert second.pos.data_state == done.state_dict()
  assert second.pos.source_state == {"pending": [], "next_seq": 6}
  # The groups in flight at the checkpoint were regenerated first, with their recorded seeds.
  want = collections.Counter(
    (problems[i].problem, groups_lib.sample_seed(sd, j)) for _, i, sd in pending for j in range(n)
  )
  assert collections.Counter(seen2[: len(want)]) == want

  # The ledger: the killed process's rows up to the checkpoint kept, its later ones (updates
  # that died with it) dropped and trained again; each issued group taken by one step, in issue
  # order, and no trajectory trained twice.
  rows = trajectory_ledger.read(tmp_path / trajectory_ledger.FILE)
  assert rows[:c] == killed_rows[:c] and len(killed_rows) in (2, 3)
  # A step the killed process trained past its checkpoint is trained again on the same groups.
  assert [r["groups"] for r in rows[c : len(killed_rows)]] == [r["groups"] for r in killed_rows[c:]]
  assert [[q for q, _, _ in r["groups"]] for r in rows] == [[0, 1], [2, 3], [4, 5]]
  assert rows[c]["groups"] == pending
  audit = trajectory_ledger.audit(rows)
  assert audit["steps_ok"] and audit["steps"] == 3 and audit["groups"] == 6
  assert audit["trained_twice"] == 0 and audit["groups_taken_twice"] == 0
  assert audit["seqs_missing"] == 0 and audit["trained"] == 3 * P * cfg.rl.group_size
  index = {(p.problem, p.answer): i for i, p in enumerate(second.problems)}
  first_six = EpochIterator(problems, seed=0).next_batch(6)
  assert [p for r in rows for _, p, _ in r["groups"]] == [
    index[(q.problem, q.answer)] for q in first_six
  ]

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
  for b in batches2:
    assert "behaviour_logprobs" in b and b["behaviour_logprobs"].shape == b["old_logprobs"].shape
    assert np.all(b["behaviour_logprobs"][b["loss_mask"] == 0] == 0)
  lag1 = batches2[-1]
  diff = np.abs(lag1["behaviour_logprobs"] - lag1["old_logprobs"])[lag1["loss_mask"] > 0]
  assert diff.max() > 1e-3
  assert recs[-1]["async/is_ratio_max"] != pytest.approx(1.0, abs=1e-4)


@pytest.mark.slow
def test_k0_is_the_synchronous_loop(setup, tmp_path):
  problems, tok, _ = setup
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
