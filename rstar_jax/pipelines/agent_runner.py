"""The rollout side shared by RL and evaluation: engine + code pool + tokenizer + reward.

`AgentRunner.rollout(problem, seed=..., settings=...)` renders the rStar2-Agent chat prompt
(system prompt, optional tool-schema block: runner options), runs the
multi-turn agent loop (generation through the shared engine, tool calls through the shared code
pool) and returns a `Trajectory`; `AgentRunner.rewards` scores trajectories against gold
answers with the math verifier, which runs out of process with a hard timeout (a pathological
answer scores 0 instead of hanging the loop).

`open_runner(run, model_config, params, tokenizer)` is the async context manager the RL loop,
evaluation and the demo use: it starts the code pool, builds the engine named by
``run.rollout.engine``, waits until a remote engine answers and closes both on exit.
`rollout_settings` / `eval_settings` are the one place sampling and agent-loop limits are
taken from a `RunConfig`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from rstar_jax.config import RunConfig, StageConfig
from rstar_jax.data.problems import Problem
from rstar_jax.learner.batch import pad_id_of
from rstar_jax.pipelines import wiring
from rstar_jax.rewards import math_reward
from rstar_jax.rewards import registry as reward_registry
from rstar_jax.tools import noise as tool_noise

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
    system_prompt: the chats' system prompt (None = the chat format's default).
    with_tools: put the tool-schema block in the system prompt.
    show_tool_time: tool responses carry the "execution time" line.
    chat_format: `chat_format.FORMATS` name of the prompt / tool-turn layout.
    tool_truncation: "project" | "released" (`agent_loop.AgentLoopConfig.tool_truncation`).
    reward_fn: ``async (response_text, gold) -> float`` (`rewards.registry.from_config`);
      None = `math_reward.score_async` with ``answer_mode``.
  """

  def __init__(
    self,
    engine,
    pool,
    tokenizer,
    *,
    tool_timeout_s: float = 4.0,
    max_response_chars: int = 1024,
    stateful_tools: bool = False,
    max_prompt_tokens: int = 2048,
    answer_mode: str = "answer_tag",
    verify_timeout_s: float = 5.0,
    system_prompt: str | None = None,
    with_tools: bool = True,
    show_tool_time: bool = True,
    chat_format: str = "rstar2",
    tool_truncation: str = "project",
    reward_fn: Callable[[str, str], Awaitable[float]] | None = None,
  ):
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
    self.reward_fn = reward_fn  # reward registry hook (issue 32)
    from rstar_jax.tokenization import chat_format as chat_lib

    self._chat = chat_lib
    self.system_prompt = system_prompt or chat_lib.get_format(chat_format).system_prompt
    self.with_tools = with_tools
    self.show_tool_time = show_tool_time
    self._prompt_cache: dict[str, list[int]] = {}
    self.pad_id = pad_id_of(tokenizer)

  @classmethod
  def from_config(cls, run: RunConfig, engine, pool, tokenizer) -> AgentRunner:
    """The runner a run config describes (tool, rollout and reward settings)."""
    t, r = run.tool, run.rollout
    return cls(
      engine,
      pool,
      tokenizer,
      tool_timeout_s=t.timeout_s,
      max_response_chars=t.max_response_chars,
      stateful_tools=t.stateful,
      max_prompt_tokens=r.max_prompt_tokens,
      answer_mode=run.rl.answer_mode,
      system_prompt=r.system_prompt,
      with_tools=r.with_tools,
      show_tool_time=t.show_time,
      chat_format=r.chat_format,
      tool_truncation=t.truncation,
      verify_timeout_s=run.reward.timeout_s,
      reward_fn=reward_registry.from_config(run),  # reward registry hook (issue 32)
    )

  def prompt_length(self, problem: Problem) -> int:
    """Tokens of ``problem``'s prompt as `prompt_ids` renders it (subclasses included);
    ``max_prompt_tokens + 1`` for a prompt that `prompt_ids` refuses as too long."""
    try:
      return len(self.prompt_ids(problem))
    except ValueError:
      return self.max_prompt_tokens + 1

  def prompt_ids(self, problem: Problem) -> list[int]:
    """The rendered prompt's ids (system prompt, tool block, question, assistant prefill)."""
    ids = self._prompt_cache.get(problem.problem)
    if ids is None:
      ids = list(
        self._chat.prompt_ids(
          self.tokenizer, self.chat_format, problem.problem, self.system_prompt, self.with_tools
        )
      )
      if len(ids) > self.max_prompt_tokens:
        raise ValueError(
          f"prompt of {len(ids)} tokens exceeds rollout.max_prompt_tokens="
          f"{self.max_prompt_tokens}: {problem.problem[:80]!r}..."
        )
      self._prompt_cache[problem.problem] = ids
    return ids

  async def rollout(self, problem: Problem, *, seed: int, settings: RolloutSettings):
    """One trajectory for ``problem`` (`rstar_jax.rollout.agent_loop` stop rules)."""
    from rstar_jax.rollout import agent_loop

    cfg = agent_loop.AgentLoopConfig(
      max_turns=settings.max_turns,
      response_budget=settings.response_budget,
      temperature=settings.temperature,
      top_p=settings.top_p,
      top_k=settings.top_k,
      max_parallel_calls=settings.max_parallel_calls,
      max_tool_calls=settings.max_tool_calls,
      tool_timeout_s=self.tool_timeout_s,
      max_tool_response_chars=self.max_response_chars,
      stateful_tool=self.stateful_tools,
      seed=int(seed),
      chat_format=self.chat_format,
      tool_truncation=self.tool_truncation,
    )
    return await agent_loop.run_trajectory(
      self.engine,
      self.tokenizer,
      tool_noise.for_trajectory(self.pool, seed),  # issue 30: per-trajectory injected failures
      problem.problem,
      cfg,
      prompt_ids=self.prompt_ids(problem),
      render=self.render_tool_response,
    )

  def render_tool_response(self, result, max_chars: int) -> str:
    """The `<tool_response>` body the model sees; subclasses change the rendering here."""
    from rstar_jax.tools.render import render_tool_response

    return render_tool_response(result, max_chars, show_time=self.show_tool_time)

  async def rewards(self, trajectories: Sequence[Any], answers: Sequence[str]) -> list[float]:
    """Binary outcome rewards (1.0 correct, 0.0 otherwise), one per trajectory."""
    if len(trajectories) != len(answers):
      raise ValueError(f"rewards: {len(trajectories)} trajectories but {len(answers)} answers")
    if self.reward_fn is not None:  # reward registry hook (issue 32)
      return list(
        await asyncio.gather(
          *(self.reward_fn(t.response_text, a) for t, a in zip(trajectories, answers))
        )
      )
    return list(
      await asyncio.gather(
        *(
          math_reward.score_async(
            t.response_text, a, mode=self.answer_mode, timeout_s=self.verify_timeout_s
          )
          for t, a in zip(trajectories, answers)
        )
      )
    )


def rollout_settings(run: RunConfig, stage: StageConfig | None = None) -> RolloutSettings:
  """Sampling + agent-loop limits of an RL stage (``None``: the rollout section's own)."""
  r = run.rollout
  return RolloutSettings(
    response_budget=stage.response_budget if stage else r.response_budget,
    max_turns=stage.max_turns if stage else r.max_turns,
    temperature=r.temperature,
    top_p=r.top_p,
    top_k=r.top_k,
    max_tool_calls=r.max_tool_calls,
    max_parallel_calls=r.max_parallel_calls,
  )


def eval_settings(run: RunConfig) -> RolloutSettings:
  """Evaluation limits: ``eval`` section (its named protocol applied, `eval_protocols`), top-k
  and tool limits from ``rollout``."""
  from rstar_jax.pipelines import eval_protocols

  e = eval_protocols.resolve(run.eval)
  return dataclasses.replace(
    rollout_settings(run),
    response_budget=e.response_budget,
    max_turns=e.max_turns,
    temperature=e.temperature,
    top_p=e.top_p,
  )


def build_engine(run: RunConfig, model_config, params, tokenizer, *, weight_version: int = 0):
  """The rollout engine named by ``run.rollout.engine``."""
  r = run.rollout
  if r.engine == "jax":
    from rstar_jax.rollout.jax_sampler import JaxSampler

    return JaxSampler(
      model_config,
      params,
      max_batch=r.max_batch,
      max_len=r.max_len or None,
      decode_chunk=r.decode_chunk,
      seed=run.train.seed,
      tokenizer=tokenizer,
      weight_version=weight_version,
    )
  from rstar_jax.distributed import fleet  # [multi-process] this process's servers
  from rstar_jax.rollout.sglang_engine import SGLangEngine

  return SGLangEngine(
    fleet.process_urls(list(r.sglang_urls)),
    staging_dir=fleet.process_staging_dir(r.staging_dir),
    weight_transport=r.weight_transport,
    weight_delta=r.weight_delta,
    colocated=r.colocated,
    server_timeout_s=r.server_timeout_s,
  )


@contextlib.asynccontextmanager
async def open_runner(
  run: RunConfig,
  model_config,
  params,
  tokenizer,
  *,
  engine=None,
  runner_cls: type[AgentRunner] = AgentRunner,
) -> AsyncIterator[AgentRunner]:
  """Starts the code pool and the engine; yields the runner; closes both."""
  if engine is None:
    engine = build_engine(run, model_config, params, tokenizer)
  pool = tool_noise.wrap(wiring.tool_pool(run.tool), run.tool)  # backend; injected failures
  await pool.start()
  try:
    if hasattr(engine, "wait_healthy"):  # remote servers: wait until they answer
      await engine.wait_healthy()
    yield runner_cls.from_config(run, engine, pool, tokenizer)
  finally:
    await pool.close()
    close = getattr(engine, "close", None)
    if close is not None:
      res = close()
      if asyncio.iscoroutine(res):
        await res
