"""One problem -> one trajectory + its reward: the rollout side shared by RL and evaluation.

`AgentRunner.rollout(problem, seed=..., settings=...)` renders the chat prompt (system prompt,
optional tool-schema block, the runner's chat format), runs the multi-turn agent loop
(generation through the shared engine, tool calls through the shared code pool) under one
`agent_loop.RolloutSettings` and returns a `Trajectory`; `AgentRunner.rewards` scores
trajectories against gold answers with the math verifier, which runs out of process with a
hard timeout (a pathological answer scores 0 instead of hanging the loop).

The runner knows nothing of the run config: `pipelines.wiring.open_runner` builds it (and the
engine and code pool) from a `RunConfig`, and `wiring.rollout_settings` / `eval_settings` build
the settings a phase passes to `rollout`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from rstar_jax.data.problems import Problem
from rstar_jax.rewards import math_reward
from rstar_jax.rollout import agent_loop
from rstar_jax.rollout.agent_loop import RolloutSettings
from rstar_jax.tokenization import chat_format as chat_lib
from rstar_jax.tools import noise as tool_noise
from rstar_jax.tools.render import render_tool_response

log = logging.getLogger(__name__)


class AgentRunner:
  """Holds the shared engine, code pool and tokenizer; runs one trajectory per call.

  Args:
    engine: an ``Engine`` (JaxSampler or SGLangEngine).
    pool: a started ``CodePool``.
    tokenizer: HF fast tokenizer of the policy (chat-format special tokens included).
    chat_format: `chat_format.FORMATS` name of the prompt layout; the settings passed to
      `rollout` must name the same one (they lay out the tool turns).
    system_prompt: the chats' system prompt (None = the chat format's default).
    with_tools: put the tool-schema block in the system prompt.
    show_tool_time: tool responses carry the "execution time" line.
    max_prompt_tokens: prompts longer than this raise (they would silently eat the budget).
    answer_mode: reward mode of `math_reward.score` ("answer_tag" paper, "anywhere",
      "released" = the released rStar2-Agent reward).
    verify_timeout_s: bound on each math-verify call.
    reward_fn: ``async (response_text, gold) -> float`` (`rewards.registry.from_config`);
      None = `math_reward.score_async` with ``answer_mode``.
  """

  def __init__(
    self,
    engine,
    pool,
    tokenizer,
    *,
    chat_format: str = "rstar2",
    system_prompt: str | None = None,
    with_tools: bool = True,
    show_tool_time: bool = True,
    max_prompt_tokens: int = 2048,
    answer_mode: str = "answer_tag",
    verify_timeout_s: float = 5.0,
    reward_fn: Callable[[str, str], Awaitable[float]] | None = None,
  ):
    self.engine = engine
    self.pool = pool
    self.tokenizer = tokenizer
    self.chat_format = chat_format
    self.system_prompt = system_prompt or chat_lib.get_format(chat_format).system_prompt
    self.with_tools = with_tools
    self.show_tool_time = show_tool_time
    self.max_prompt_tokens = max_prompt_tokens
    self.answer_mode = answer_mode
    self.verify_timeout_s = verify_timeout_s
    self.reward_fn = reward_fn  # reward registry hook (issue 32)
    self._prompt_cache: dict[str, list[int]] = {}
    self.pad_id = chat_lib.pad_id_of(tokenizer)

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
        chat_lib.prompt_ids(
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
    if settings.chat_format != self.chat_format:
      raise ValueError(
        f"AgentRunner.rollout: settings.chat_format {settings.chat_format!r} differs from the "
        f"runner's {self.chat_format!r} (the prompt and the tool turns would disagree)"
      )
    return await agent_loop.run_trajectory(
      self.engine,
      self.tokenizer,
      tool_noise.for_trajectory(self.pool, seed),  # issue 30: per-trajectory injected failures
      problem.problem,
      dataclasses.replace(settings, seed=int(seed)),
      prompt_ids=self.prompt_ids(problem),
      render=self.render_tool_response,
    )

  def render_tool_response(self, result, max_chars: int) -> str:
    """The `<tool_response>` body the model sees; subclasses change the rendering here."""
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
