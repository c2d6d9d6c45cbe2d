"""The async multi-turn agent loop (rStar2-Agent §2.3; docs/fidelity.md): one coroutine per trajectory.

Each trajectory generates until `<|im_end|>`, parses `<tool_call>` JSON, awaits the code pool and
appends the tool turn as template ids with loss mask 0, then generates again. Trajectories never
wait for one another (no per-turn barrier): while one awaits its tool call, others generate.

Stop conditions, checked in this order after each assistant turn:
  abort (engine) -> length (budget used up, or the turn hit max_new_tokens) -> stop (no tool
  call) -> max_turns -> max_tool_calls (budget already spent) -> tool_error (the pool raised) ->
  tool_overflow (the tool turn would not leave room for one more generated token; the loop stops
  BEFORE appending it, so a trajectory always ends on an assistant turn; the calls of that
  last turn are still recorded in `tool_calls`, since the model did issue them).
The response budget counts tool tokens: each generate gets max_new_tokens = budget - used.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rstar_jax.models import routes as routes_lib
from rstar_jax.rollout.types import GenerateRequest, SamplingParams, ToolCallRecord, Trajectory
from rstar_jax.tokenization import chat_format
from rstar_jax.tools.render import render_tool_response

_TRAJ_COUNTER = itertools.count()
TRUNCATIONS = ("project", "released")
RELEASED_TRUNCATION_MARKER = "...(truncated)..."


def truncate_middle_released(text: str, max_chars: int) -> str:
  """verl's ``tool_response_truncate_side="middle"``: a text longer than ``max_chars`` becomes
  its first and last ``max_chars // 2`` characters joined by "...(truncated)..." (so the
  result is max_chars + 17 characters for an even limit); shorter texts are unchanged."""
  if max_chars < 1:
    raise ValueError(f"truncate_middle_released: max_chars must be >= 1, got {max_chars}")
  if len(text) <= max_chars:
    return text
  half = max_chars // 2
  return text[:half] + RELEASED_TRUNCATION_MARKER + (text[-half:] if half else "")


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
  """Everything the agent loop reads about one trajectory: limits, sampling and tool handling.
  The one settings type from the config to the loop: `pipelines.wiring.rollout_settings` /
  `eval_settings` build it once per phase from the ``rollout``, ``tool``, ``eval`` sections and
  the stage; each turn's `SamplingParams` are cut from it. Defaults: rStar2-Agent RL stage 1
  (paper; the released values are in docs/fidelity.md).

  response_budget: max response tokens, generated + tool (8192 stage 1, 12288 later).
  max_turns: max assistant turns (paper 10 / 10 / 15 per stage, 30 at eval; released code 5).
  temperature / top_p / top_k: sampling (top_k -1 = off).
  max_parallel_calls: calls executed per turn; 0 = all (paper), 1 = released verl behaviour.
  max_tool_calls: tool-call budget per trajectory (ASTER); 0 = unlimited. A turn's calls are
      cut to the remaining budget; once spent, a further call ends the trajectory.
  tool_timeout_s: per-call execution limit passed to the pool (rStar README: 4 s).
  max_tool_response_chars: middle-truncation limit of each rendered tool response (released
      code: 256).
  tool_truncation: "project" (the renderer keeps the whole body within the limit, marker
      included) | "released" (verl's middle truncation: the first and last limit // 2
      characters around "...(truncated)...", see `truncate_middle_released`).
  chat_format: `rstar_jax.tokenization.chat_format` format name ("rstar2",
      "rstar2_released", "qwen3_thinking"): prompt, tool name and tool-turn joining.
  stateful_tool: pass a per-trajectory session_id to the pool (ASTER); False = stateless.
  stop_token_ids: ids that end an assistant turn (`chat_format.stop_token_ids`: <|im_end|>
      and the checkpoint's generation_config EOS ids); () = the tokenizer's <|im_end|> alone.
  seed: base seed; each turn's seed derives from (seed, problem, sample, turn). None = random.
      `AgentRunner.rollout` sets it per trajectory.
  max_concurrent: at most this many trajectories in flight in run_agent_loop; 0 = all.
  """

  response_budget: int = 8192
  max_turns: int = 10
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = -1
  max_parallel_calls: int = 0
  max_tool_calls: int = 0
  tool_timeout_s: float = 4.0
  max_tool_response_chars: int = 1024
  tool_truncation: str = "project"
  chat_format: str = "rstar2"
  stateful_tool: bool = False
  stop_token_ids: tuple[int, ...] = ()
  seed: int | None = None
  max_concurrent: int = 0

  def __post_init__(self):
    def need(name, ok, what):
      if not ok:
        raise ValueError(f"RolloutSettings.{name}: expected {what}, got {getattr(self, name)!r}")

    need("response_budget", self.response_budget >= 1, "an int >= 1")
    need("max_turns", self.max_turns >= 1, "an int >= 1")
    need("temperature", self.temperature >= 0, ">= 0")
    need("top_p", 0 < self.top_p <= 1, "a value in (0, 1]")
    need("top_k", self.top_k == -1 or self.top_k >= 1, "-1 or >= 1")
    need("max_parallel_calls", self.max_parallel_calls >= 0, ">= 0 (0 = all)")
    need("max_tool_calls", self.max_tool_calls >= 0, ">= 0 (0 = unlimited)")
    need("tool_timeout_s", self.tool_timeout_s > 0, "> 0")
    need("max_tool_response_chars", self.max_tool_response_chars >= 1, ">= 1")
    need("max_concurrent", self.max_concurrent >= 0, ">= 0 (0 = all)")
    need("tool_truncation", self.tool_truncation in TRUNCATIONS, f"one of {TRUNCATIONS}")
    need(
      "chat_format",
      self.chat_format in chat_format.FORMATS,
      f"one of {sorted(chat_format.FORMATS)}",
    )


_NO_LIMIT = 1 << 62


def _turn_seed(seed: int | None, *keys: Any) -> int | None:
  if seed is None:
    return None
  digest = hashlib.blake2b(repr((seed,) + keys).encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") >> 1


def _default_render(result, max_chars: int) -> str:
  return render_tool_response(result, max_chars)


@dataclasses.dataclass
class _Builder:
  """Accumulates the per-token fields of one trajectory.

  routes: [P + len(ids), R, k] MoE routes of the whole sequence (prompt included), created at
  the first engine result that reports routes; each later report is written at the positions
  it covers (`routes.write_routes`: the first report of a position wins, the one its next
  token was sampled with; a NO_ROUTE never erases one), so a tool turn's tokens get the routes
  the next turn's engine call reports for them, and a re-prefill after an eviction does not
  replace the routes the earlier turn sampled with.
  """

  prompt_len: int = 0
  ids: list = dataclasses.field(default_factory=list)
  mask: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  versions: list = dataclasses.field(default_factory=list)
  routes: Any = None

  def add_routes(self, res):
    """Records ``res``'s routes, called after its kept output tokens were added: positions
    past them (output cut by the budget) are dropped."""
    if res.routes is None:
      return
    self.routes = self.final_routes(tuple(np.shape(res.routes)[1:]))
    routes_lib.write_routes(self.routes, int(res.routes_start), np.asarray(res.routes))

  def final_routes(self, shape=None):
    """[prompt_len + len(ids), R, k]: the recorded routes, NO_ROUTE-extended over tokens
    appended since (tool turns); None when no engine result had routes."""
    if self.routes is None and shape is None:
      return None
    n = self.prompt_len + len(self.ids)
    have = self.routes if self.routes is not None else routes_lib.empty_routes(0, shape)
    if len(have) < n:
      have = np.concatenate([have, routes_lib.empty_routes(n - len(have), have.shape[1:])])
    return have

  def add_generated(self, ids, logprobs, versions):
    self.ids += [int(t) for t in ids]
    self.mask += [1] * len(ids)
    self.logprobs += [float(x) for x in logprobs]
    self.versions += [int(v) for v in versions]

  def add_template(self, ids):
    last = self.versions[-1] if self.versions else -1
    self.ids += ids
    self.mask += [0] * len(ids)
    self.logprobs += [0.0] * len(ids)
    self.versions += [last] * len(ids)


async def _execute(
  pool, call: chat_format.ToolCall, cfg: RolloutSettings, session_id, render
) -> tuple[ToolCallRecord, bool]:
  """Runs one parsed call; returns its record and whether the pool itself raised."""
  if call.error is not None:
    return ToolCallRecord("parse_error", 0.0, "", call.error), False
  t0 = time.perf_counter()
  try:
    res = await pool.execute(call.code, call.stdin, cfg.tool_timeout_s, session_id)
  except Exception as e:  # noqa: BLE001 - the pool failing is an outcome, not a crash
    return ToolCallRecord(
      "internal_error",
      time.perf_counter() - t0,
      call.code,
      f"Error when executing tool: {type(e).__name__}: {e}",
    ), True
  # A "session_lost" result (the tool node or Ray actor holding this trajectory's session
  # died) keeps its status: the renderer tells the policy, as a tool failure, that its variables
  # are gone, and the step's metrics count it (tool_status_session_lost_frac, tool errors).
  # Not "internal_error", which would re-roll the whole trajectory as a lost worker.
  if cfg.tool_truncation == "released":
    # The released loop cuts the tool's whole text after rendering, at its own rule.
    text = truncate_middle_released(render(res, _NO_LIMIT), cfg.max_tool_response_chars)
  else:
    text = render(res, cfg.max_tool_response_chars)
  return ToolCallRecord(res.status, float(res.duration_s), call.code, text), False


async def run_trajectory(
  engine,
  tokenizer,
  pool,
  question: str,
  config: RolloutSettings,
  *,
  problem_index: int = 0,
  sample_index: int = 0,
  prompt_ids: Sequence[int] | None = None,
  render: Callable[[Any, int], str] = _default_render,
  trajectory_id: str | None = None,
) -> Trajectory:
  """One rollout of `question` (or of pre-rendered `prompt_ids`) to a Trajectory.

  engine: anything with `async generate([GenerateRequest]) -> [GenerateResult]`; if it also has
      `trajectory_lease(tid, budget_tokens)` (an async context manager, e.g. SGLangEngine's
      KV-capacity scheduler) the trajectory holds a lease for its whole life.
  pool: `await pool.execute(code, stdin, timeout_s, session_id) -> ExecResult`.
  """
  fmt = chat_format.get_format(config.chat_format)
  prompt = (
    list(prompt_ids) if prompt_ids is not None else chat_format.prompt_ids(tokenizer, fmt, question)
  )
  stop_ids = tuple(config.stop_token_ids) or (chat_format.stop_token_id(tokenizer),)
  tid = trajectory_id or f"traj{next(_TRAJ_COUNTER)}-p{problem_index}-s{sample_index}"
  session_id = tid if config.stateful_tool else None
  lease_fn = getattr(engine, "trajectory_lease", None)
  lease = (
    lease_fn(tid, len(prompt) + config.response_budget)
    if lease_fn is not None
    else contextlib.nullcontext()
  )
  b = _Builder(prompt_len=len(prompt))
  calls: list[ToolCallRecord] = []
  turns = 0
  prefill: int | None = 0  # None once an engine turn does not report it
  finish = "length"
  async with lease:
    try:
      while True:
        remaining = config.response_budget - len(b.ids)
        if remaining <= 0:
          finish = "length"
          break
        sp = SamplingParams(
          max_new_tokens=remaining,
          temperature=config.temperature,
          top_p=config.top_p,
          top_k=config.top_k,
          stop_token_ids=stop_ids,
          seed=_turn_seed(config.seed, problem_index, sample_index, turns),
        )
        req = GenerateRequest(prompt + b.ids, sp, rid=f"{tid}:{turns}")
        res = (await engine.generate([req]))[0]
        turns += 1
        if prefill is not None:
          prefill = None if res.prefill_tokens is None else prefill + res.prefill_tokens
        out = list(res.output_ids)[:remaining]  # an engine must not exceed the budget
        b.add_generated(out, list(res.logprobs)[: len(out)], res.token_versions()[: len(out)])
        b.add_routes(res)
        if res.finish_reason == "abort":
          finish = "abort"
          break
        if len(b.ids) >= config.response_budget or res.finish_reason == "length":
          finish = "length"
          break
        # Decoded only to find tool calls; the ids above are what the trajectory keeps.
        parsed = chat_format.parse_tool_calls(
          tokenizer.decode(out, skip_special_tokens=False), fmt.tool_name
        )
        if not parsed:
          finish = "stop"
          break
        if turns >= config.max_turns:
          finish = "max_turns"
          break
        if config.max_parallel_calls:
          parsed = parsed[: config.max_parallel_calls]
        if config.max_tool_calls:
          left = config.max_tool_calls - len(calls)
          if left <= 0:
            finish = "max_tool_calls"
            break
          parsed = parsed[:left]
        outcomes = await asyncio.gather(
          *[_execute(pool, c, config, session_id, render) for c in parsed]
        )
        records = [dataclasses.replace(r, turn=turns - 1) for r, _ in outcomes]
        calls += records
        if any(raised for _, raised in outcomes):
          finish = "tool_error"
          break
        tool_ids = chat_format.tool_turn_ids(tokenizer, fmt, [r.output_text for r in records])
        if len(b.ids) + len(tool_ids) >= config.response_budget:
          finish = "tool_overflow"
          break
        b.add_template(tool_ids)
    finally:
      if session_id is not None and hasattr(pool, "close_session"):
        with contextlib.suppress(Exception):
          await pool.close_session(session_id)
  text = tokenizer.decode(b.ids, skip_special_tokens=False)
  return Trajectory(
    prompt_ids=prompt,
    response_ids=b.ids,
    loss_mask=b.mask,
    logprobs=b.logprobs,
    weight_versions=b.versions,
    num_turns=turns,
    tool_calls=calls,
    finish_reason=finish,
    num_answer_tags=text.count("<answer>"),
    response_text=text,
    problem_index=problem_index,
    sample_index=sample_index,
    prefill_tokens=prefill,
    routes=b.final_routes(),
  )


def _question(p: Any) -> str:
  if isinstance(p, str):
    return p
  q = getattr(p, "problem", None)
  if q is None and isinstance(p, dict):
    q = p.get("problem", p.get("question"))
  if not isinstance(q, str):
    raise TypeError(
      f"run_agent_loop: a problem must be a str, have a .problem str or a "
      f"'problem' key; got {type(p).__name__}"
    )
  return q


async def run_agent_loop(
  engine,
  tokenizer,
  pool,
  problems: Sequence[Any],
  n_samples: int,
  config: RolloutSettings,
  progress: Callable[[int, int, Trajectory], Any] | None = None,
  render: Callable[[Any, int], str] = _default_render,
) -> list[Trajectory]:
  """`n_samples` trajectories per problem, all concurrent; returned problem-major
  ([p0s0, p0s1, ..., p1s0, ...]). `progress(done, total, trajectory)` runs as each finishes
  (it may be a coroutine function)."""
  if n_samples < 1:
    raise ValueError(f"run_agent_loop: n_samples must be >= 1, got {n_samples}")
  questions = [_question(p) for p in problems]
  prompts = [chat_format.prompt_ids(tokenizer, config.chat_format, q) for q in questions]
  total = len(questions) * n_samples
  sem = asyncio.Semaphore(config.max_concurrent) if config.max_concurrent else None
  done = 0

  async def one(pi: int, si: int) -> Trajectory:
    nonlocal done
    async with sem if sem is not None else contextlib.nullcontext():
      t = await run_trajectory(
        engine,
        tokenizer,
        pool,
        questions[pi],
        config,
        problem_index=pi,
        sample_index=si,
        prompt_ids=prompts[pi],
        render=render,
      )
    done += 1
    if progress is not None:
      r = progress(done, total, t)
      if asyncio.iscoroutine(r):
        await r
    return t

  return list(
    await asyncio.gather(*[one(pi, si) for pi in range(len(questions)) for si in range(n_samples)])
  )
