"""Injected transient tool failures (`rstar_jax.tools.noise`, issue 30): rate, per-trajectory
determinism, what the policy sees through the real agent loop, and that the default is off."""

import asyncio
import random

import pytest

from configs import demo as demo_config
from rstar_jax.config import from_config_dict
from rstar_jax.config.schema import ToolConfig
from rstar_jax.data.problems import Problem
from rstar_jax.pipelines import wiring
from rstar_jax.rollout import agent_runner
from rstar_jax.rollout.agent_loop import RolloutSettings
from rstar_jax.rollout.types import GenerateResult
from rstar_jax.tokenization import bpe, chat_format
from rstar_jax.tools import noise
from rstar_jax.tools.code_pool import ExecResult


class CountingPool:
  """Answers every call with its code as stdout; counts the calls that reached it."""

  def __init__(self):
    self.calls = 0

  async def execute(self, code, stdin="", timeout_s=None, session_id=None):
    self.calls += 1
    await asyncio.sleep(random.random() * 1e-3)  # interleave concurrent trajectories
    return ExecResult(status="ok", stdout=code)

  async def close_session(self, session_id):
    return True


async def _statuses(pool, seed: int, n: int) -> list[str]:
  view = noise.for_trajectory(pool, seed)
  return [(await view.execute(f"print({i})", "", 1.0)).status for i in range(n)]


def test_rate_matches_its_setting_and_failures_do_not_run():
  inner = CountingPool()
  pool = noise.NoisyPool(inner, 0.3, seed=5)

  async def main():
    return await asyncio.gather(*(_statuses(pool, s, 10) for s in range(400)))

  statuses = [s for traj in asyncio.run(main()) for s in traj]
  failed = statuses.count("error")
  assert abs(failed / len(statuses) - 0.3) < 0.03  # 4000 calls: binomial sd 0.007
  assert inner.calls == len(statuses) - failed  # an injected failure never runs the code
  res = asyncio.run(noise.NoisyPool(inner, 1.0).execute("print(1)"))
  assert res.status == "error" and res.stderr == noise.TRANSIENT_STDERR


def test_deterministic_per_trajectory_whatever_runs_beside_it():
  pool = noise.NoisyPool(CountingPool(), 0.5, seed=1)

  async def alone():
    return await _statuses(pool, 7, 30)

  async def crowded():
    out = await asyncio.gather(*(_statuses(pool, s, 30) for s in (3, 7, 11, 7)))
    return out[1], out[3]

  a = asyncio.run(alone())
  b, c = asyncio.run(crowded())
  assert a == b == c and "error" in a and "ok" in a
  other = asyncio.run(_statuses(pool, 8, 30))
  assert other != a  # another trajectory of the group fails other calls
  reseeded = asyncio.run(_statuses(noise.NoisyPool(CountingPool(), 0.5, seed=2), 7, 30))
  assert reseeded != a  # tool.inject_seed changes the pattern


def test_default_off_builds_no_wrapper():
  inner = CountingPool()
  assert ToolConfig().inject_failure_rate == 0.0
  assert noise.wrap(inner, ToolConfig()) is inner
  assert noise.for_trajectory(inner, 3) is inner
  for variant in ("", "noisy"):  # the noisy demo keeps injection as an option, off
    assert from_config_dict(demo_config.get_config(variant)).tool.inject_failure_rate == 0.0
  wrapped = noise.wrap(inner, ToolConfig(inject_failure_rate=0.25, inject_seed=4))
  assert isinstance(wrapped, noise.NoisyPool) and (wrapped.rate, wrapped.seed) == (0.25, 4)
  assert asyncio.run(wrapped.close_session("s")) is True  # the pool's other methods pass through
  with pytest.raises(ValueError, match="tool.inject_failure_rate"):
    noise.NoisyPool(inner, 1.5)
  cfg = demo_config.get_config("smoke")
  cfg.tool.inject_failure_rate = 2.0
  with pytest.raises(Exception, match="inject_failure_rate"):
    from_config_dict(cfg)


class CallThenAnswer:
  """Turn 1 calls the tool; turn 2 answers with the last stdout it saw (or 'none')."""

  def __init__(self, tok):
    self.tok = tok

  async def generate(self, requests):
    out = []
    for req in requests:
      text = self.tok.decode(list(req.input_ids), skip_special_tokens=False)
      if "<tool_response>" in text:
        seen = text.split("stdout: ")[-1].split("\n")[0] if "stdout: " in text else "none"
        reply = f"ok</reason><answer>\\boxed{{{seen}}}</answer>"
      else:
        reply = "go" + chat_format.format_tool_call("print(42)")
      ids = self.tok.encode(reply, add_special_tokens=False) + [chat_format.stop_token_id(self.tok)]
      out.append(GenerateResult(ids, [0.0] * len(ids), "stop", 0))
    return out


def test_the_policy_sees_injected_failures_through_the_runner():
  """The hook in `agent_runner`: a runner over a NoisyPool renders the transient failure into
  the trajectory (status error, message in the tool turn), seed by seed reproducibly."""
  prob = Problem(problem="Compute 6 * 7.", answer="42")
  tok = bpe.train_bpe_tokenizer([chat_format.prompt_text("rstar2", prob.problem), "print(42)"], 600)
  settings = RolloutSettings(response_budget=300, max_turns=3)

  async def run(rate, reverse=False):
    pool = noise.wrap(CountingPool(), ToolConfig(inject_failure_rate=rate))
    runner = agent_runner.AgentRunner(CallThenAnswer(tok), pool, tok)
    seeds = list(range(40))
    # Concurrent, and in reverse order on the rerun: only per-trajectory streams agree.
    trajs = await asyncio.gather(
      *(
        runner.rollout(prob, seed=s, settings=settings) for s in (seeds[::-1] if reverse else seeds)
      )
    )
    return trajs[::-1] if reverse else trajs

  always = asyncio.run(run(1.0))
  for t in always:
    (call,) = t.tool_calls
    assert call.status == "error" and noise.TRANSIENT_STDERR in call.output_text
    assert "Tool call failure" in t.response_text and "\\boxed{none}" in t.response_text
  half = asyncio.run(run(0.5))
  pattern = [t.tool_calls[0].status for t in half]
  assert 5 < pattern.count("error") < 35
  assert pattern == [t.tool_calls[0].status for t in asyncio.run(run(0.5, reverse=True))]
  clean = asyncio.run(run(0.0))
  assert all(t.tool_calls[0].status == "ok" for t in clean)
  assert all("\\boxed{print(42)}" in t.response_text for t in clean)  # CountingPool echoes code


def test_open_runner_wraps_the_pool_it_builds():
  cfg = demo_config.get_config("smoke")
  cfg.tool.num_workers = 1
  seen = {}
  tok = bpe.train_bpe_tokenizer(["print(42)"], 600)  # from_config reads its stop ids
  for rate in (0.0, 0.2):
    cfg.tool.inject_failure_rate = rate
    run = from_config_dict(cfg)

    async def main(run, rate):
      async with wiring.open_runner(run, None, None, tok, engine=object()) as runner:
        seen[rate] = runner.pool

    asyncio.run(main(run, rate))
  assert not isinstance(seen[0.0], noise.NoisyPool)
  assert isinstance(seen[0.2], noise.NoisyPool) and seen[0.2].rate == 0.2
