"""Evaluation and step metrics with real tool calls: a scripted engine writes rStar2 tool calls (docs/reference.md §3)
and answers, the real agent loop executes them in the real code pool, the real verifier scores
them. No model is involved, so the expected numbers are known exactly."""

import asyncio
import re

import pytest

from rstar_jax.config import from_config_dict
from rstar_jax.data.problems import Problem
from rstar_jax.pipelines import evaluation
from rstar_jax.rollout import agent_runner
from rstar_jax.rollout.agent_loop import RolloutSettings
from rstar_jax.rollout.types import GenerateResult
from rstar_jax.tokenization import bpe, chat_format
from rstar_jax.tools.code_pool import CodePool


class ScriptedEngine:
  """Turn 1: calls the tool with the code registered for the question. Turn 2: answers with
  the last stdout it was shown (or "none")."""

  def __init__(self, tokenizer, codes):
    self.tok, self.codes, self.weight_version, self.calls = tokenizer, codes, 0, 0

  async def generate(self, requests):
    out = []
    for req in requests:
      self.calls += 1
      text = self.tok.decode(list(req.input_ids), skip_special_tokens=False)
      if "<tool_response>" in text:
        m = re.findall(r"stdout: (\S+)", text)
        reply = f"Done.</reason><answer>\\boxed{{{m[-1] if m else 'none'}}}</answer>"
      else:
        q = text.split("This is the problem:\n")[-1].split("<|im_end|>")[0]
        reply = "Let me compute." + chat_format.format_tool_call(self.codes[q])
      ids = self.tok.encode(reply, add_special_tokens=False) + [chat_format.stop_token_id(self.tok)]
      out.append(GenerateResult(ids, [0.0] * len(ids), "stop", 0))
    return out

  async def update_weights(self, config, params, version=None):
    self.weight_version = version


PROBLEMS = [
  Problem(problem="What is 6 times 7?", answer="42"),
  Problem(problem="What is 2 to the 10th?", answer="1000"),  # wrong gold on purpose
  Problem(problem="What is 1 over 0?", answer="0"),
]
CODES = {
  "What is 6 times 7?": "print(6 * 7)",
  "What is 2 to the 10th?": "print(2 ** 10)",
  "What is 1 over 0?": "print(1 / 0)",
}


@pytest.fixture(scope="module")
def tokenizer():
  corpus = [chat_format.prompt_text("rstar2", p.problem) for p in PROBLEMS] + list(CODES.values())
  return bpe.train_bpe_tokenizer(corpus, 600)


def test_evaluate_metrics_with_real_tools_and_verifier(tokenizer, tmp_path):
  async def main():
    async with CodePool(num_workers=2) as pool:
      runner = agent_runner.AgentRunner(ScriptedEngine(tokenizer, CODES), pool, tokenizer)
      settings = RolloutSettings(response_budget=400, max_turns=3, temperature=0.6, top_p=0.95)
      return await evaluation.evaluate(runner, PROBLEMS, settings, k=2, seed=1, keep_samples=2)

  report = asyncio.run(main())
  m = report["metrics"]
  assert m["accuracy"] == pytest.approx(1 / 3) and m["pass_at_k"] == pytest.approx(1 / 3)
  assert m["num_problems"] == 3 and m["k"] == 2
  assert m["tool_calls_per_traj"] == 1.0 and m["turns_per_traj"] == 2.0
  assert m["tool_error_ratio"] == pytest.approx(1 / 3)  # 1/0 raises in the sandbox
  assert m["pos_tool_error_ratio"] == 0.0
  assert m["truncation_rate"] == 0.0 and m["answer_tags_eq1_frac"] == 1.0
  assert [p["num_correct"] for p in report["per_problem"]] == [2, 0, 0]
  assert "\\boxed{42}" in report["samples"][0]["response"]
  evaluation.write_report(report, tmp_path / "r.json")
  assert (tmp_path / "r.json").stat().st_size > 0


def test_truncation_counted_when_budget_is_too_small(tokenizer):
  async def main():
    async with CodePool(num_workers=1) as pool:
      runner = agent_runner.AgentRunner(ScriptedEngine(tokenizer, CODES), pool, tokenizer)
      settings = RolloutSettings(response_budget=8, max_turns=3)
      return await evaluation.evaluate(runner, PROBLEMS[:1], settings, k=1)

  m = asyncio.run(main())["metrics"]
  assert m["truncation_rate"] == 1.0 and m["accuracy"] == 0.0


class PlannedEngine(ScriptedEngine):
  """First turns follow the plan A, B, B, C, A, B, B, C, ... in arrival order:
  A: one correct call then the answer (p_err 0); B: a failing call, then the correct call, then
  the answer (p_err 0.5); C: a wrong call then the (wrong) answer."""

  PLAN = "ABBC"

  def __init__(self, tokenizer):
    super().__init__(tokenizer, {})
    self.first_turns = 0

  async def generate(self, requests):
    out = []
    for req in requests:
      text = self.tok.decode(list(req.input_ids), skip_special_tokens=False)
      response = text.split("<|im_start|>assistant\n<reason>", 1)[1]
      if "Plan" not in response:
        plan = self.PLAN[self.first_turns % 4]
        self.first_turns += 1
        code = {"A": "print(6 * 7)", "B": "print(6 * 7 / 0)", "C": "print(6 * 8)"}[plan]
        reply = f"Plan {plan}." + chat_format.format_tool_call(code)
      elif "Plan B" in response and response.count("<tool_response>") == 1:
        reply = "Retry." + chat_format.format_tool_call("print(6 * 7)")
      else:
        ans = re.findall(r"stdout: (\S+)", response)[-1]
        reply = f"Done.</reason><answer>\\boxed{{{ans}}}</answer>"
      ids = self.tok.encode(reply, add_special_tokens=False) + [chat_format.stop_token_id(self.tok)]
      out.append(GenerateResult(ids, [0.0] * len(ids), "stop", self.weight_version))
    return out


def test_rl_step_roc_keeps_cleaner_positives_with_real_tools(tokenizer, tmp_path, roc_mode="paper"):
  from configs import rstar2_tiny_cpu
  from rstar_jax.pipelines import rl_loop, wiring

  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.mesh.num_devices = 1
  cfg.rl.group_size, cfg.rl.oversample, cfg.rl.min_pos, cfg.rl.min_neg = 4, 2, 1, 1
  cfg.rl.roc_mode = roc_mode
  cfg.train.batch_prompts = 1
  cfg.stages = [
    dict(
      name="s",
      steps=1,
      response_budget=400,
      max_turns=4,
      data="full",
      reset_optimizer=False,
      drop_solved_k_of_k=0,
    )
  ]
  cfg = from_config_dict(cfg)
  learner = wiring.build_learner(cfg)
  problems = [Problem(problem="What is 6 times 7?", answer="42")]

  async def main():
    async with CodePool(num_workers=2) as pool:
      runner = agent_runner.AgentRunner(PlannedEngine(tokenizer), pool, tokenizer)
      loop = rl_loop.RLLoop(cfg, learner, runner, str(tmp_path), problems=problems)
      last = await loop.run()
      loop.ckpt.close()
      return last

  m = asyncio.run(main())
  # 8 rollouts: A B B C A B B C -> positives 2 A (1 ok call) + 4 B (1 failed + 1 ok call).
  assert m["reward_mean"] == pytest.approx(6 / 8) and m["mixed_frac"] == 1.0
  assert m["pos_tool_error_ratio"] == pytest.approx(4 / 10)
  assert m["tool_calls_per_traj"] == pytest.approx((2 + 8 + 2) / 8)
  # G = 4: 1 negative (min_neg) and 3 positives, the two clean A's first.
  assert m["kept_num_trajectories"] == 4 and m["kept_reward_mean"] == pytest.approx(3 / 4)
  assert m["kept_pos_tool_error_ratio"] == pytest.approx(1 / 4)
  assert m["optimizer_step"] == 1 and m["weight_version"] == 1
  assert m["tool_latency_mean_s"] > 0 and m["tool_status_error_frac"] == pytest.approx(4 / 12)


@pytest.mark.slow
def test_killed_tool_worker_mid_step_loses_no_data(tokenizer, tmp_path):
  """Every sandbox template is SIGKILLed while it holds running tool calls (triggered by the
  calls' arrival, not by a clock); the step still ends with all its rollouts, each with a
  successful call and the right answer: the same numbers as a step nobody interfered with."""
  import os
  import signal

  from configs import rstar2_tiny_cpu
  from rstar_jax.pipelines import rl_loop, wiring

  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.mesh.num_devices = 1
  cfg.rl.group_size, cfg.rl.oversample = 2, 2
  cfg.train.batch_prompts = 1
  cfg.stages = [
    dict(
      name="s",
      steps=1,
      response_budget=400,
      max_turns=3,
      data="full",
      reset_optimizer=False,
      drop_solved_k_of_k=0,
    )
  ]
  q = "What is 6 times 7?"
  codes = {q: "import time\ntime.sleep(1.0)\nprint(6 * 7)"}
  cfg = from_config_dict(cfg)
  learner = wiring.build_learner(cfg)

  async def main():
    async with CodePool(num_workers=4) as pool:
      runner = agent_runner.AgentRunner(ScriptedEngine(tokenizer, codes), pool, tokenizer)
      loop = rl_loop.RLLoop(
        cfg, learner, runner, str(tmp_path), problems=[Problem(problem=q, answer="42")]
      )
      killed = []

      async def killer():
        # Wait until every template (the pool's own sandbox processes) has a call sent to it
        # and not yet answered, then kill them all: each of those calls is then cut off
        # mid-run, whatever the machine's speed.
        while not all(t.pending for t in pool._templates):
          await asyncio.sleep(0.005)
        for t in pool._templates:
          killed.append(sum(1 for f in t.pending.values() if not f.done()))
          os.killpg(t.proc.pid, signal.SIGKILL)

      task = asyncio.create_task(asyncio.wait_for(killer(), 300))
      last = await loop.run()
      await task
      loop.ckpt.close()
      return last, killed, [t.restarts for t in pool._templates]

  last, killed, restarts = asyncio.run(main())
  assert len(killed) >= 1 and all(n >= 1 for n in killed), killed
  assert restarts == [1] * len(killed)  # each template died once, mid-call, and came back
  # The un-killed step's numbers (the scripted engine is deterministic): 4 rollouts, each one
  # tool call that succeeded (on the replacement template for the killed ones), all correct.
  assert last["num_trajectories"] == 4 and last["reward_mean"] == 1.0
  assert last["tool_status_ok_frac"] == 1.0 and last["tool_calls_total"] == 4
  assert last["tool_error_ratio"] == 0.0
