"""The RL loop on a tiny model with the real JaxSampler and code pool: stage transitions, the hard
subset, optimizer reset, resume, and retries after a failing engine call.

The tiny random model never answers correctly, so the reward is replaced by a deterministic
rule on the gold answer (even answer: every rollout "correct"; odd: alternate correct / wrong).
That makes groups informative (real updates) and fixes the hard subset exactly, while the
loop, engine, agent loop and pool are the real ones.
"""

import asyncio
import dataclasses

import jax
import numpy as np
import pytest

from configs import rstar2_tiny_cpu
from rstar_jax.config import from_config_dict
from rstar_jax.data import synthetic_tasks
from rstar_jax.data.iterator import EpochIterator
from rstar_jax.data.problems import Problem
from rstar_jax.pipelines import data_sources, rl_loop, wiring
from rstar_jax.pipelines.metrics_log import read_jsonl_metrics
from rstar_jax.rollout import groups as groups_lib
from rstar_jax.rollout.agent_loop import RolloutSettings
from rstar_jax.rollout.types import ToolCallRecord, Trajectory


def _config():
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.mesh.num_devices = 2  # 2-way FSDP: sharded batches and row padding, kept cheap
  cfg.train.batch_prompts = 2
  cfg.rl.group_size, cfg.rl.oversample = 2, 2  # 4 rollouts per prompt (counts below)
  cfg.rollout.response_budget = 16
  cfg.rollout.max_turns = 1
  cfg.optim.warmup_steps = 2
  cfg.train.eval_every = 3  # one held-out evaluation, at the last step
  cfg.eval.response_budget = 12
  cfg.stages = [
    dict(
      name="s1",
      steps=2,
      response_budget=16,
      max_turns=1,
      data="full",
      reset_optimizer=False,
      drop_solved_k_of_k=0,
    ),
    dict(
      name="s2_hard",
      steps=1,
      response_budget=12,
      max_turns=1,
      data="hard",
      reset_optimizer=True,
      drop_solved_k_of_k=2,
    ),
  ]
  return cfg


def _problems():
  probs = synthetic_tasks.generate(3, 40, families=["mul"], difficulty="easy")
  odd = [p for p in probs if int(p.answer) % 2][:5]
  even = [p for p in probs if not int(p.answer) % 2][:1]
  return odd[:3] + even + odd[3:]  # exactly one always-solved problem (index 3)


async def _rule_rewards(trajs, answers):
  return [1.0 if int(a) % 2 == 0 else float(i % 2) for i, a in enumerate(answers)]


class FlakyEngine:
  """Wraps an engine; the listed generate calls (1-based) raise, as a dropped server would."""

  def __init__(self, inner, fail_calls=(3,)):
    self.inner, self.fail_calls, self.calls = inner, set(fail_calls), 0

  @property
  def weight_version(self):
    return self.inner.weight_version

  async def generate(self, requests):
    self.calls += 1
    if self.calls in self.fail_calls:
      raise ConnectionError(f"injected engine failure on call {self.calls}")
    return await self.inner.generate(requests)

  async def update_weights(self, config, params, version=None):
    return await self.inner.update_weights(config, params, version)


def _run(cfg, workdir, problems, tokenizer, max_steps, flaky=False):
  cfg = from_config_dict(cfg, "rl")
  learner = wiring.build_learner(cfg)

  async def main():
    engine = wiring.build_engine(cfg, learner.model_config, learner.params_copy(), tokenizer)
    if flaky:
      engine = FlakyEngine(engine)
    async with wiring.open_runner(
      cfg, learner.model_config, None, tokenizer, engine=engine
    ) as runner:
      runner.rewards = _rule_rewards
      loop = rl_loop.RLLoop(
        cfg, learner, runner, str(workdir), problems=problems, eval_problems=problems[:2]
      )
      await loop.run(max_steps=max_steps)
      loop.ckpt.close()
      return loop, engine

  return asyncio.run(main())


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  cfg = _config()
  problems = _problems()
  tok = data_sources.ensure_tokenizer(
    from_config_dict(cfg),
    str(tmp_path_factory.mktemp("tok")),
    data_sources.tokenizer_corpus(problems),
  )
  return cfg, problems, tok


def test_stages_hard_subset_reset_and_resume(setup, tmp_path):
  cfg, problems, tok = setup
  # Segment 1: one step, with the 3rd engine call failing (the rollout is retried), then the
  # process "dies".
  first, flaky = _run(cfg, tmp_path, problems, tok, max_steps=1, flaky=True)
  assert first.pos.rl_step == 1 and first.pos.stage_index == 0 and first.pos.stage_step == 1
  recs = read_jsonl_metrics(tmp_path / "metrics.jsonl")
  # No data lost: every sampled rollout is there, one retry was needed.
  assert recs[0]["num_trajectories"] == 2 * 4 and recs[0]["rollout_retries"] >= 1
  assert flaky.calls == 2 * 4 + 1
  seed = int(cfg.train.seed)
  expect_full = EpochIterator(problems, seed=seed)
  expect_full.next_batch(2)
  assert first.pos.data_state == expect_full.state_dict()

  # Segment 2: a fresh loop (new learner, engine, pool) resumes and finishes both stages.
  resumed, engine = _run(cfg, tmp_path, problems, tok, max_steps=None)
  recs = read_jsonl_metrics(tmp_path / "metrics.jsonl")
  assert [r["step"] for r in recs] == [1, 2, 3]
  # The sampler's evictions per step add up to its count (the flaky wrapper of segment 1 has
  # none to report).
  assert "rollout/prefix_evictions" not in recs[0]
  assert sum(r["rollout/prefix_evictions"] for r in recs[1:]) == engine.evictions >= 0
  assert [r["stage"] for r in recs] == [0, 0, 1]
  assert resumed.pos.rl_step == 3 and resumed.pos.stage_index == 2
  # Hard subset: exactly the always-solved problem (index 3) is dropped.
  assert resumed.pos.hard_indices == [0, 1, 2, 4, 5]
  assert resumed.pos.hard_subset_stats["hard_subset_dropped"] == 1
  # The hard stage reads its own fresh iterator over the subset: 1 step of 2 prompts.
  expect_hard = EpochIterator([problems[i] for i in (0, 1, 2, 4, 5)], seed=seed)
  expect_hard.next_batch(2)
  assert resumed.pos.data_state == expect_hard.state_dict()
  # Every step updated (odd-answer groups are informative) and pushed its weights.
  assert [r["optimizer_step"] for r in recs] == [1, 2, 3]
  assert [r["weight_version"] for r in recs] == [1, 2, 3]
  assert resumed.runner.engine.weight_version == 3 and int(resumed.learner.state.step) == 3
  # Optimizer reset at the hard stage: warm-up restarts (lr/2 again instead of lr); the
  # restored optimizer state carried step 2's warm-up position across the resume.
  lr = cfg.optim.lr
  np.testing.assert_allclose([r["learning_rate"] for r in recs], [lr / 2, lr, lr / 2], rtol=1e-5)
  assert recs[0]["all_correct_frac"] + recs[0]["mixed_frac"] == pytest.approx(1.0)
  # The sampler's log-probs equal the learner's recomputed ones on the same weights: the
  # token alignment of trajectory -> batch -> loss is right.
  assert all(r["sampler_logprob_drift"] < 1e-3 for r in recs)
  assert "eval_accuracy" not in recs[1] and recs[2]["eval_num_problems"] == 2
  assert recs[2]["eval_accuracy"] == 0.5  # the rule reward on 2 odd-answer problems, k=1
  for key in (
    "time_rollout_s",
    "time_reward_s",
    "time_update_s",
    "time_weight_push_s",
    "pos_tool_error_ratio",
    "tool_calls_per_traj",
    "truncation_ratio",
    "entropy",
    "grad_norm",
    "all_wrong_frac",
    "answer_tags_mean",
  ):
    assert key in recs[-1], key


# ----------------------------------------------------------------------------- retry unit test
class _FakeRunner:
  """Returns a trajectory whose tool call lost its worker on the first attempt of each job."""

  def __init__(self):
    self.attempts = {}
    self.engine = None

  async def rollout(self, problem, *, seed, settings):
    n = self.attempts[seed] = self.attempts.get(seed, 0) + 1
    status = "internal_error" if n == 1 else "ok"
    return Trajectory(
      prompt_ids=[1],
      response_ids=[2, 3],
      loss_mask=[1, 1],
      logprobs=[0.0, 0.0],
      weight_versions=[0, 0],
      num_turns=1,
      tool_calls=[ToolCallRecord(status, 0.0, "print(1)", "")],
      finish_reason="stop",
    )


def test_lost_tool_worker_is_retried_not_kept():
  settings = RolloutSettings(response_budget=8, max_turns=1)
  probs = [Problem(problem="p1", answer="1"), Problem(problem="p2", answer="2")]
  made = asyncio.run(
    groups_lib.make_groups(_FakeRunner(), probs, [11, 12], 3, settings, max_retries=2)
  )
  groups, retries = made.groups, made.retries
  assert made.generated == 6 and len(groups) == 2 and all(len(g) == 3 for g in groups)
  assert all(t.tool_calls[0].status == "ok" for g in groups for t in g)
  assert retries == 6


def test_rollout_that_keeps_failing_raises_naming_it():
  class Broken(_FakeRunner):
    async def rollout(self, problem, *, seed, settings):
      raise ConnectionError("engine down")

  settings = RolloutSettings(response_budget=8, max_turns=1)
  with pytest.raises(RuntimeError, match=r"problem 0 sample 0 failed 2 times.*engine down"):
    asyncio.run(
      groups_lib.make_groups(
        Broken(), [Problem(problem="p", answer="1")], [0], 1, settings, max_retries=1
      )
    )


def test_stages_called_alone_on_a_normally_built_loop(tmp_path):
  """score -> select -> build_batch of a normally constructed loop, on fixed trajectories:
  RoC keeps G per informative group, the batch has the fixed row count and the advantages."""
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.mesh.num_devices = 1
  cfg.train.batch_prompts = 2
  cfg.rl.group_size, cfg.rl.oversample = 2, 2  # groups of 4 below, RoC keeps 2
  cfg.rl.roc_mode = "released"
  run = from_config_dict(cfg)
  learner = wiring.build_learner(run)

  class Runner(_FakeRunner):
    pad_id = 0

    async def rewards(self, trajs, answers):
      return [float(t.response_ids[0] % 2) for t in trajs]

  def traj(first, calls):
    return Trajectory(
      prompt_ids=[1, 2],
      response_ids=[first, 5],
      loss_mask=[1, 1],
      logprobs=[-0.5, -0.5],
      weight_versions=[0, 0],
      num_turns=1,
      tool_calls=[ToolCallRecord(s, 0.0, "", "") for s in calls],
      finish_reason="stop",
      response_text="<answer>\\boxed{1}</answer>",
    )

  loop = rl_loop.RLLoop(
    run, learner, Runner(), str(tmp_path), problems=[Problem(problem="p", answer="1")]
  )
  groups = [
    [traj(3, ["error"]), traj(3, []), traj(2, []), traj(2, [])],  # mixed
    [traj(2, []), traj(4, []), traj(6, []), traj(8, [])],
  ]  # all wrong
  ro = rl_loop.Rollouts(
    [Problem("p", "1"), Problem("q", "2")], groups, 7, jax.random.key(0), 0, 0.0
  )
  scores = asyncio.run(loop.score(ro))
  np.testing.assert_array_equal(scores.rewards, [[1, 1, 0, 0], [0, 0, 0, 0]])
  assert scores.penalties[0, 0] > scores.penalties[0, 1]  # the failed tool call
  sel = loop.select(ro, scores)
  assert sel.selection.keep_group.tolist() == [True, False]
  # "released": the lowest-penalty positive (index 1) and one negative are kept.
  assert sel.trajectories == [groups[0][1], groups[0][2]] or sel.trajectories == [
    groups[0][1],
    groups[0][3],
  ]
  assert sel.advantages[0] > 0 > sel.advantages[1]
  # train.pack_rows (default): both 4-token trajectories share one row, segment by segment,
  # with per-token advantages; the padding fractions before/after land in the metrics.
  metrics = {}
  packed = loop.build_batch(sel, metrics)
  assert packed["input_ids"].shape == (loop.learner.row_multiple, 64)
  np.testing.assert_array_equal(packed["segment_ids"][0, :9], [1, 1, 1, 1, 2, 2, 2, 2, 0])
  np.testing.assert_array_equal(packed["positions"][0, :8], [0, 1, 2, 3, 0, 1, 2, 3])
  np.testing.assert_allclose(packed["advantages"][0, :8], np.repeat(sel.advantages, 4))
  assert metrics["batch/rows_packed"] == loop.learner.row_multiple
  assert metrics["batch/pad_fraction_unpacked"] == pytest.approx(1 - 8 / (loop.rows * 64))
  assert metrics["batch/pad_fraction_packed"] < metrics["batch/pad_fraction_unpacked"]
  # Unpacked (train.pack_rows=False, or a per-row loss_agg): the fixed row count.
  for train, rl in [
    (dataclasses.replace(run.train, pack_rows=False), run.rl),
    (run.train, dataclasses.replace(run.rl, loss_agg="seq-mean-token-mean")),
  ]:
    loop.config = dataclasses.replace(run, train=train, rl=rl)
    batch = loop.build_batch(sel)
    assert batch["input_ids"].shape == (loop.rows, 64) and loop.rows == 2 * 2
    assert "segment_ids" not in batch
    np.testing.assert_allclose(batch["advantages"][:2], sel.advantages)
    assert (batch["advantages"][2:] == 0).all() and batch["loss_mask"][2:].sum() == 0
  loop.ckpt.close()


def test_rl_step_through_sglang_engine_pushes_weights(setup, tmp_path, metrics_doc_check):
  """The same loop with rollout.engine="sglang" against the mock SGLang HTTP server: rollouts
  over HTTP, and the weight push stages an HF directory the server loads (version 1)."""
  from rstar_jax.rollout.testing.mock_sglang import MockSGLangServer

  cfg, problems, tok = setup
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.mesh.num_devices = 1
  cfg.rl.group_size, cfg.rl.oversample = 2, 1
  cfg.rl.drop_zero_variance = False  # a random policy: keep the all-wrong group anyway
  cfg.train.batch_prompts = 1
  cfg.rollout.engine = "sglang"
  cfg.rollout.staging_dir = str(tmp_path / "staging")
  cfg.stages = [
    dict(
      name="s",
      steps=1,
      response_budget=8,
      max_turns=1,
      data="full",
      reset_optimizer=False,
      drop_solved_k_of_k=0,
    )
  ]
  learner = wiring.build_learner(from_config_dict(cfg))

  async def main():
    async with MockSGLangServer(vocab_size=1024) as server:
      cfg.rollout.sglang_urls = [server.url]
      run = from_config_dict(cfg)
      async with wiring.open_runner(run, learner.model_config, None, tok) as runner:
        loop = rl_loop.RLLoop(run, learner, runner, str(tmp_path), problems=problems[:1])
        last = await loop.run()
        loop.ckpt.close()
      return last, server

  last, server = asyncio.run(main())
  assert len(server.requests) == 2 and last["num_trajectories"] == 2
  assert last["optimizer_step"] == 1 and last["weight_version"] == 1
  assert last["batch/pad_fraction_packed"] <= last["batch/pad_fraction_unpacked"]  # packed
  assert len(server.weight_updates) == 1 and str(server.weight_version) == "1"
  assert "push/bytes" in metrics_doc_check(read_jsonl_metrics(tmp_path / "metrics.jsonl"))


def test_resume_after_steps_without_update(setup, tmp_path):
  """A random policy gets every group wrong: steps make no update (no new orbax step), yet a
  resumed run continues at the right RL step and data position (side file)."""
  cfg, problems, tok = setup
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.mesh.num_devices = 1
  cfg.train.batch_prompts = 2
  cfg.stages = [
    dict(
      name="s",
      steps=3,
      response_budget=8,
      max_turns=1,
      data="full",
      reset_optimizer=False,
      drop_solved_k_of_k=0,
    )
  ]

  def run(max_steps):
    rc = from_config_dict(cfg)
    learner = wiring.build_learner(rc)

    async def main():
      async with wiring.open_runner(rc, learner.model_config, learner.params_copy(), tok) as runner:
        loop = rl_loop.RLLoop(rc, learner, runner, str(tmp_path), problems=problems)
        await loop.run(max_steps=max_steps)
        loop.ckpt.close()
        return loop

    return asyncio.run(main())

  first = run(2)
  assert first.pos.rl_step == 2 and int(first.learner.state.step) == 0
  rng_after_two = np.asarray(first.learner.state.rng)
  second = run(None)
  recs = read_jsonl_metrics(tmp_path / "metrics.jsonl")
  assert [r["step"] for r in recs] == [1, 2, 3] and all(r["skipped_step"] == 1 for r in recs)
  assert second.pos.rl_step == 3 and second.pos.stage_index == 1
  expect = EpochIterator(problems, seed=int(cfg.train.seed))
  for _ in range(3):
    expect.next_batch(2)
  assert second.pos.data_state == expect.state_dict()
  # The RNG continued from where the first run stopped (one split per step).
  assert not np.array_equal(np.asarray(second.learner.state.rng), rng_after_two)
  resumed_rng = np.asarray(jax.random.split(rng_after_two)[0])
  assert np.array_equal(np.asarray(second.learner.state.rng), resumed_rng)


def test_ppo_mini_batches_and_epochs_make_several_updates_per_step(setup, tmp_path):
  """rl.ppo_mini_batches x rl.ppo_epochs optimizer updates per RL step; old log-probs come from
  the policy before the first update, so later updates see a ratio away from 1."""
  cfg, problems, tok = setup
  cfg = _config()
  cfg.rl.ppo_mini_batches, cfg.rl.ppo_epochs = 2, 2
  cfg.optim.warmup_steps = 0
  cfg.stages = [
    dict(
      name="s",
      steps=1,
      response_budget=16,
      max_turns=1,
      data="full",
      reset_optimizer=False,
      drop_solved_k_of_k=0,
    )
  ]
  cfg.train.eval_every = 0
  loop, _ = _run(cfg, tmp_path, problems, tok, max_steps=None)
  rec = read_jsonl_metrics(tmp_path / "metrics.jsonl")[0]
  assert rec["ppo_updates"] == 4 and rec["optimizer_step"] == 4
  assert int(loop.learner.state.step) == 4
  # Weight versions name optimizer steps: the engine serves the policy after the 4th update.
  assert rec["weight_version"] == 4 and loop.runner.engine.weight_version == 4
  # Averaged over 4 updates, 3 of them off-policy: the ratio moved away from exactly 1.
  assert rec["ratio_abs_dev"] > 0
