"""The rollout side shared by RL and evaluation: engine + code pool + tokenizer + reward.

`AgentRunner.rollout(problem, seed=..., settings=...)` renders the SPEC §3 prompt, runs the
multi-turn agent loop (generation through the shared engine, tool calls through the shared code
pool) and returns a `Trajectory`; `AgentRunner.rewards` scores trajectories against gold
answers with the math verifier, which runs out of process with a hard timeout (a pathological
answer scores 0 instead of hanging the loop).

`open_runner(config, model_config, params, tokenizer)` is the async context manager the loops
use: it starts the code pool, builds the engine named by ``config.rollout.engine`` and closes
both on exit.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any, AsyncIterator, Sequence

import ml_collections

from rstar_jax.data.problems import Problem
from rstar_jax.rewards import math_reward

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
  """Per-phase sampling and agent-loop limits (RL stage or evaluation).

  Attributes:
    response_budget: generated + tool tokens per trajectory.
    max_turns: assistant turns per trajectory.
    temperature, top_p, top_k: sampling (top_k -1 = off).
    max_tool_calls: tool calls per trajectory (0 = unlimited; ASTER 50).
    max_parallel_calls: calls executed per turn (0 = all, paper).
  """

  response_budget: int
  max_turns: int
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = -1
  max_tool_calls: int = 0
  max_parallel_calls: int = 0


class AgentRunner:
  """Holds the shared engine, code pool and tokenizer; runs one trajectory per call.

  Args:
    engine: an ``Engine`` (JaxSampler or SGLangEngine).
    pool: a started ``CodePool``.
    tokenizer: HF fast tokenizer of the policy (chat-format special tokens included).
    tool_timeout_s: wall-clock limit per tool call.
    max_response_chars: tool response body limit (middle truncation).
    stateful_tools: one interpreter session per trajectory (ASTER) instead of fresh processes.
    max_prompt_tokens: prompts longer than this raise (they would silently eat the budget).
    answer_mode: reward mode of `math_reward.score` ("answer_tag" paper, "anywhere",
      "released" = the released rStar2-Agent reward).
    verify_timeout_s: bound on each math-verify call.
    chat_format: `chat_format.FORMATS` name of the prompt / tool-turn layout.
    tool_truncation: "project" | "released" (`agent_loop.AgentLoopConfig.tool_truncation`).
  """

  def __init__(self, engine, pool, tokenizer, *, tool_timeout_s: float = 4.0,
               max_response_chars: int = 1024, stateful_tools: bool = False,
               max_prompt_tokens: int = 2048, answer_mode: str = "answer_tag",
               verify_timeout_s: float = 5.0, chat_format: str = "rstar2",
               tool_truncation: str = "project"):
    self.engine = engine
    self.pool = pool
    self.tokenizer = tokenizer
    self.tool_timeout_s = tool_timeout_s
    self.max_response_chars = max_response_chars
    self.stateful_tools = stateful_tools
    self.max_prompt_tokens = max_prompt_tokens
    self.answer_mode = answer_mode
    self.verify_timeout_s = verify_timeout_s
    self.chat_format = chat_format
    self.tool_truncation = tool_truncation
    self._prompt_cache: dict[str, list[int]] = {}
    from rstar_jax.tokenization import chat_format
    self._chat = chat_format
    self.pad_id = _pad_id(tokenizer)

  def prompt_length(self, problem: Problem) -> int:
    """Tokens of ``problem``'s prompt as `prompt_ids` renders it (subclasses included);
    ``max_prompt_tokens + 1`` for a prompt that `prompt_ids` refuses as too long."""
    try:
      return len(self.prompt_ids(problem))
    except ValueError:
      return self.max_prompt_tokens + 1

  def prompt_ids(self, problem: Problem) -> list[int]:
    ids = self._prompt_cache.get(problem.problem)
    if ids is None:
      ids = list(self._chat.prompt_ids(self.tokenizer, self.chat_format, problem.problem))
      if len(ids) > self.max_prompt_tokens:
        raise ValueError(f"prompt of {len(ids)} tokens exceeds rollout.max_prompt_tokens="
                         f"{self.max_prompt_tokens}: {problem.problem[:80]!r}...")
      self._prompt_cache[problem.problem] = ids
    return ids

  async def rollout(self, problem: Problem, *, seed: int, settings: RolloutSettings):
    """One trajectory for ``problem`` (agent loop, SPEC §3.4 stop rules)."""
    from rstar_jax.rollout import agent_loop
    cfg = agent_loop.AgentLoopConfig(
        max_turns=settings.max_turns, response_budget=settings.response_budget,
        temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
        max_parallel_calls=settings.max_parallel_calls, max_tool_calls=settings.max_tool_calls,
        tool_timeout_s=self.tool_timeout_s, max_tool_response_chars=self.max_response_chars,
        stateful_tool=self.stateful_tools, seed=int(seed), chat_format=self.chat_format,
        tool_truncation=self.tool_truncation)
    return await agent_loop.run_trajectory(self.engine, self.tokenizer, self.pool,
                                           problem.problem, cfg,
                                           prompt_ids=self.prompt_ids(problem),
                                           render=self.render_tool_response)

  def render_tool_response(self, result, max_chars: int) -> str:
    """The `<tool_response>` body the model sees; subclasses change the rendering here."""
    from rstar_jax.tools.render import render_tool_response
    return render_tool_response(result, max_chars)

  async def rewards(self, trajectories: Sequence[Any], answers: Sequence[str]) -> list[float]:
    """Binary outcome rewards (1.0 correct, 0.0 otherwise), one per trajectory."""
    if len(trajectories) != len(answers):
      raise ValueError(f"rewards: {len(trajectories)} trajectories but {len(answers)} answers")
    return list(await asyncio.gather(*(
        math_reward.score_async(t.response_text, a, mode=self.answer_mode,
                                timeout_s=self.verify_timeout_s)
        for t, a in zip(trajectories, answers))))


def _pad_id(tokenizer) -> int:
  for attr in ("pad_token_id", "eos_token_id"):
    v = getattr(tokenizer, attr, None)
    if isinstance(v, int):
      return v
  return 0


def build_engine(config: ml_collections.ConfigDict, model_config, params, tokenizer,
                 *, weight_version: int = 0):
  """The rollout engine named by ``config.rollout.engine``."""
  r = config.rollout
  if r.engine == "jax":
    from rstar_jax.rollout.jax_sampler import JaxSampler
    return JaxSampler(model_config, params, max_batch=int(r.max_batch),
                      max_len=r.get("max_len", None) or None,
                      decode_chunk=int(r.get("decode_chunk", 16)), seed=int(config.train.seed)
                      if "train" in config else 0, tokenizer=tokenizer,
                      weight_version=weight_version)
  if r.engine == "sglang":
    from rstar_jax.rollout.sglang_engine import SGLangEngine
    return SGLangEngine(list(r.sglang_urls), staging_dir=r.staging_dir)
  raise ValueError(f"config.rollout.engine: expected 'jax' or 'sglang', got {r.engine!r}")


@contextlib.asynccontextmanager
async def open_runner(config: ml_collections.ConfigDict, model_config, params, tokenizer,
                      *, engine=None) -> AsyncIterator[AgentRunner]:
  """Starts the code pool and the engine; yields the `AgentRunner`; closes both."""
  from rstar_jax.tools.code_pool import CodePool
  t = config.tool
  if engine is None:
    engine = build_engine(config, model_config, params, tokenizer)
  pool = CodePool(num_workers=int(t.num_workers), timeout_s=float(t.timeout_s),
                  memory_limit_mb=int(t.memory_limit_mb))
  await pool.start()
  try:
    if hasattr(engine, "wait_healthy"):   # remote servers: wait until they answer
      await engine.wait_healthy()
    yield AgentRunner(engine, pool, tokenizer, tool_timeout_s=float(t.timeout_s),
                      max_response_chars=int(t.max_response_chars),
                      stateful_tools=bool(t.stateful),
                      max_prompt_tokens=int(config.rollout.max_prompt_tokens),
                      answer_mode=config.rl.get("answer_mode", "answer_tag")
                      if "rl" in config else "answer_tag",
                      chat_format=config.rollout.get("chat_format", "rstar2"),
                      tool_truncation=t.get("truncation", "project"))
  finally:
    await pool.close()
    close = getattr(engine, "close", None)
    if close is not None:
      res = close()
      if asyncio.iscoroutine(res):
        await res
