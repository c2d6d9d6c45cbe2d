"""Interaction-dense cold-start trajectories (ASTER; docs/reference.md §8.2) from a scripted solver.

The solver really runs every call through the code pool. Per problem (with `solution_code`):
  1. optionally an exploratory call that prints the problem's numbers (a partial step);
  2. optionally a deliberately broken version of the solving code (a misspelt `print` or a
     missing parenthesis); the pool reports the error and the next turn says so and fixes it;
  3. the solving call (the reference `solution_code`);
  4. the answer `<answer>\\boxed{N}</answer>` with N copied from the last call's stdout.
A trajectory is kept only when N equals the gold answer and the last call succeeded (every
failed call was corrected by a later successful one); then ASTER's interaction-density
selection keeps trajectories with at least `min_tool_calls` calls, the densest
`max_trajectories` first (0 = all).

`style` picks the solver's shape (issue 30, the claims benchmark):
  "mixed"   the steps above, each by its probability (the demo's cold start);
  "dense"   several interleaved calls: always the exploratory call, then the solve (or the
            broken call and its fix): >= 2 calls, no answer before the tool said it;
  "sparse"  one late verification call: the answer is first worked out in the reasoning text
            ("in the head"), then the reference code checks it once (ASTER's interaction-sparse
            trajectories); exactly 1 call.
  "graded"  between the two (issue 42, ASTER's collapse): each chat's call count drawn uniformly
            from 1 to 4: the sparse shape (1), exploration + solve (2), exploration + broken call
            + fix (3), and that followed by a re-check of the result (4); `max_calls` does not
            apply. A policy that starts with several calls can then drift toward fewer under RL.
`explore_fail_prob` (noisy environments) makes the exploratory call fail (it names variables
it never defined) and lets the trajectory go on to the solve without fixing it: an error that
does not change the answer, which outcome-only reward cannot tell from a clean trajectory.
It draws from its own random stream, so 0 leaves every other choice as it was.

Trajectories are chat messages (`rstar_jax.data.sft_data.ChatExample`); tool messages hold the
response text rendered by `rstar_jax.tools.render` exactly as the agent loop renders it, and
`render_examples` turns them into (ids, loss_mask) with `chat_format.render_chat_ids`, i.e. the
same ids the agent loop produces for the same conversation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Sequence
from typing import Any

from rstar_jax.data.problems import Problem
from rstar_jax.data.sft_data import ChatExample
from rstar_jax.tokenization import chat_format
from rstar_jax.tools.code_pool import CodePool
from rstar_jax.tools.render import render_tool_response

EXPLORE_TEXT = "I check the numbers first.</reason>"
SOLVE_TEXT = "Now I compute the answer.</reason>"
BUGGY_TEXT = "I compute the answer.</reason>"
FIX_TEXT = "The code failed. I fix it.</reason>"
FINAL_TEXT = "The output is {n}.</reason><answer>\\boxed{{{n}}}</answer>"
EXPLORE_FAIL_TEXT = "I look at the values first.</reason>"
AFTER_FAIL_TEXT = "That call failed, but it was only a check. I compute the answer.</reason>"
MENTAL_TEXT = "I work it out: the answer is {n}. I verify it with the tool.</reason>"
RECHECK_TEXT = "I run it once more to be sure.</reason>"
STYLES = ("mixed", "dense", "sparse", "graded")


@dataclasses.dataclass(frozen=True)
class ColdStartConfig:
  """Scripted-solver and selection settings.

  Attributes:
    explore_prob: probability of an exploratory first call ("mixed").
    bug_prob: probability of a broken call that is then corrected ("mixed", "dense").
    explore_fail_prob: probability that the exploratory call fails and is not fixed (a
      recoverable error that leaves the answer unchanged).
    style: "mixed" | "dense" | "sparse" | "graded" (module docstring).
    min_tool_calls: ASTER density threshold (calls per kept trajectory).
    max_trajectories: keep at most this many, densest first (0 = all).
    max_calls: at most this many calls per trajectory (0 = no cap); the exploratory call is
      left out first.
    max_response_chars: tool-response body limit (must equal the agent loop's).
    show_time: whether tool responses carry the "execution time" line (must equal the agent
      loop's rendering).
    tool_timeout_s: per-call limit.
    system_prompt: written as the chats' system message ("" = the chat format's default).
    seed: seeds the per-problem choices.
  """

  explore_prob: float = 0.8
  bug_prob: float = 0.3
  explore_fail_prob: float = 0.0
  style: str = "mixed"
  min_tool_calls: int = 2
  max_trajectories: int = 0
  max_calls: int = 0
  max_response_chars: int = 256
  show_time: bool = True
  tool_timeout_s: float = 4.0
  system_prompt: str = ""
  seed: int = 0

  def __post_init__(self):
    if self.style not in STYLES:
      raise ValueError(f"ColdStartConfig.style: expected one of {STYLES}, got {self.style!r}")
    for name in ("explore_prob", "bug_prob", "explore_fail_prob"):
      v = getattr(self, name)
      if not 0.0 <= v <= 1.0:
        raise ValueError(f"ColdStartConfig.{name}: expected a probability in [0, 1], got {v!r}")
    if self.min_tool_calls < 0:
      raise ValueError(f"ColdStartConfig.min_tool_calls: expected >= 0, got {self.min_tool_calls}")
    if self.max_trajectories < 0:
      raise ValueError(
        f"ColdStartConfig.max_trajectories: expected >= 0 (0 = all), got {self.max_trajectories}"
      )
    if self.max_calls < 0:
      raise ValueError(
        f"ColdStartConfig.max_calls: expected >= 0 (0 = no cap), got {self.max_calls}"
      )
    if self.max_response_chars < 32:
      raise ValueError(
        f"ColdStartConfig.max_response_chars: expected >= 32, got {self.max_response_chars}"
      )


def explore_code(problem: Problem) -> str:
  """A partial first step: print the problem's numbers (in the generator's parameter order)."""
  vals = [v for v in problem.params.values() if isinstance(v, int)]
  return "print(" + ", ".join(str(v) for v in vals) + ")" if vals else "print('start')"


def break_code(code: str, rng: random.Random) -> str:
  """A broken variant of `code`: a NameError (misspelt print) or a SyntaxError."""
  if "print(" in code and rng.random() < 0.5:
    i = code.rfind("print(")
    return code[:i] + "prnt(" + code[i + len("print(") :]
  i = code.rfind(")")
  return code[:i] + code[i + 1 :] if i >= 0 else code + "("


def failing_explore_code(problem: Problem) -> str:
  """An exploratory call that raises NameError: it prints the parameter names, never bound."""
  names = [k for k, v in problem.params.items() if isinstance(v, int)] or ["x"]
  return "print(" + ", ".join(names) + ")"


def plan_calls(problem: Problem, config: ColdStartConfig, index: int) -> list[tuple[str, str]]:
  """(assistant text, code) of each call the scripted solver makes for ``problem``.

  Pure in (problem, config, index); the final answer turn is not part of the plan.
  """
  rng = random.Random(f"coldstart:{config.seed}:{index}")
  if config.style == "sparse":
    return [(MENTAL_TEXT.format(n=problem.answer.strip()), problem.solution_code)]
  if config.style == "graded":
    return _graded_plan(problem, rng.randint(1, 4), rng)
  plan = []
  if config.style == "dense" or rng.random() < config.explore_prob:
    plan.append((EXPLORE_TEXT, explore_code(problem)))
  if rng.random() < config.bug_prob:
    plan.append((BUGGY_TEXT, break_code(problem.solution_code, rng)))
    plan.append((FIX_TEXT, problem.solution_code))
  else:
    plan.append((SOLVE_TEXT, problem.solution_code))
  noise = random.Random(f"coldstart-noise:{config.seed}:{index}")
  if plan[0][0] == EXPLORE_TEXT and noise.random() < config.explore_fail_prob:
    plan[0] = (EXPLORE_FAIL_TEXT, failing_explore_code(problem))
    if plan[1][0] == SOLVE_TEXT:
      plan[1] = (AFTER_FAIL_TEXT, plan[1][1])
  explores = (EXPLORE_TEXT, EXPLORE_FAIL_TEXT)
  if config.max_calls and len(plan) > config.max_calls and plan[0][0] in explores:
    plan = plan[1:]
  plan = plan[-config.max_calls :] if config.max_calls else plan
  if plan[0][0] in (FIX_TEXT, AFTER_FAIL_TEXT):  # no failed call before it: the plain solve
    plan[0] = (SOLVE_TEXT, plan[0][1])
  return plan


def _graded_plan(problem: Problem, n_calls: int, rng: random.Random) -> list[tuple[str, str]]:
  """The "graded" style's plan with ``n_calls`` (1-4) calls (module docstring)."""
  code = problem.solution_code
  if n_calls == 1:
    return [(MENTAL_TEXT.format(n=problem.answer.strip()), code)]
  plan = [(EXPLORE_TEXT, explore_code(problem))]
  if n_calls == 2:
    return plan + [(SOLVE_TEXT, code)]
  plan += [(BUGGY_TEXT, break_code(code, rng)), (FIX_TEXT, code)]
  return plan + [(RECHECK_TEXT, code)] if n_calls == 4 else plan


def _call_msg(text: str, code: str) -> dict:
  return {
    "role": "assistant",
    "content": text,
    "tool_calls": [
      {"function": {"name": chat_format.TOOL_NAME, "arguments": {"code": code, "input": ""}}}
    ],
  }


async def solve_one(
  pool, problem: Problem, config: ColdStartConfig, index: int
) -> ChatExample | None:
  """The scripted trajectory of one problem, or None when it is not kept (wrong answer or a
  final call that failed)."""

  if not problem.solution_code:
    return None
  plan = plan_calls(problem, config, index)
  messages: list[dict] = []
  if config.system_prompt:
    messages.append({"role": "system", "content": config.system_prompt})
  messages.append({"role": "user", "content": problem.problem})
  statuses = []
  last = None
  for text, code in plan:
    res = await pool.execute(code, "", config.tool_timeout_s)
    statuses.append(res.status)
    last = res
    messages.append(_call_msg(text, code))
    messages.append(
      {
        "role": "tool",
        "content": render_tool_response(res, config.max_response_chars, show_time=config.show_time),
      }
    )
  if last is None or last.status != "ok":
    return None
  n = last.stdout.strip()
  if n != problem.answer.strip():
    return None
  messages.append({"role": "assistant", "content": FINAL_TEXT.format(n=n)})
  return ChatExample(
    messages=tuple(messages),
    extra={
      "problem": problem.problem,
      "answer": problem.answer,
      "family": problem.family,
      "num_tool_calls": len(plan),
      "tool_statuses": statuses,
    },
  )


def select_dense(
  examples: Sequence[ChatExample], min_tool_calls: int, max_trajectories: int = 0
) -> tuple[list[ChatExample], dict]:
  """ASTER's density selection: keep chats with >= `min_tool_calls` tool calls, then the
  `max_trajectories` densest (0 = all; ties in input order); the kept ones stay in input order.
  """
  dense = [i for i, e in enumerate(examples) if e.num_tool_calls >= min_tool_calls]
  if max_trajectories:
    dense = sorted(sorted(dense, key=lambda i: -examples[i].num_tool_calls)[:max_trajectories])
  kept = [examples[i] for i in dense]
  return kept, {
    "dense_candidates": len(examples),
    "dropped_sparse": sum(e.num_tool_calls < min_tool_calls for e in examples),
    "kept": len(kept),
    "mean_tool_calls_kept": (sum(e.num_tool_calls for e in kept) / len(kept)) if kept else 0.0,
  }


async def build_coldstart(
  problems: Sequence[Problem], pool, config: ColdStartConfig
) -> tuple[list[ChatExample], dict]:
  """Runs the scripted solver on every problem through `pool`, filters and selects.

  Returns (kept chats in problem order, counts: problems, solved, dropped_wrong,
  calls_total, calls_failed, dropped_sparse, kept, mean_tool_calls_kept).
  """
  outs = await asyncio.gather(*(solve_one(pool, p, config, i) for i, p in enumerate(problems)))
  solved = [o for o in outs if o is not None]
  kept, stats = select_dense(solved, config.min_tool_calls, config.max_trajectories)
  statuses = [s for o in solved for s in o.extra["tool_statuses"]]
  return kept, {
    "problems": len(problems),
    "solved": len(solved),
    "dropped_wrong": len(problems) - len(solved),
    "calls_total": len(statuses),
    "calls_failed": sum(s != "ok" for s in statuses),
    **stats,
  }


def build_coldstart_sync(
  problems: Sequence[Problem], config: ColdStartConfig, num_workers: int = 2
) -> tuple[list[ChatExample], dict]:
  """`build_coldstart` with its own CodePool (for scripts)."""

  async def main():
    async with CodePool(num_workers=num_workers) as pool:
      return await build_coldstart(problems, pool, config)

  return asyncio.run(main())


def render_examples(
  tokenizer, examples: Sequence[ChatExample], *, with_tools: bool = True
) -> list[tuple[list[int], list[int]]]:
  """(input_ids [P+R], loss_mask [P+R]) per chat; mask 1 exactly on assistant-written tokens
  (the chat's own system message, if any, is the system prompt)."""
  out = []
  for i, ex in enumerate(examples):
    try:
      rc = chat_format.render_chat_ids(tokenizer, list(ex.messages), with_tools=with_tools)
    except (ValueError, TypeError, KeyError) as e:
      raise ValueError(f"cold-start chat {i}: cannot render: {e}") from e
    out.append((rc.input_ids, rc.full_loss_mask))
  return out


def chat_texts(examples: Sequence[ChatExample]) -> list[Any]:
  """Texts of every message (tokenizer training corpus)."""
  texts = []
  for ex in examples:
    for m in ex.messages:
      texts.append(str(m.get("content", "")))
      for c in m.get("tool_calls") or ():
        texts.append(chat_format.format_tool_call(c["function"]["arguments"]["code"]))
  return texts
