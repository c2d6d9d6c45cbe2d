"""Data types shared by the rollout engines (JaxSampler, SGLangEngine) and the agent loop.

Token-in / token-out: requests carry prompt token ids and results carry generated token ids;
nothing in the rollout path decodes ids and re-encodes text (docs/reference.md §12).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

FINISH_REASONS = ("stop", "length", "abort")
# Trajectory-level finish reasons written by the agent loop (see agent_loop.py).
TRAJECTORY_FINISH_REASONS = (
  "stop",  # the model ended a turn without a tool call
  "length",  # the response-token budget is used up (generated or tool tokens)
  "max_turns",  # the assistant-turn limit was reached with a tool call pending
  "max_tool_calls",  # the tool-call budget (ASTER) was used up
  "tool_overflow",  # appending the tool response would overflow the budget (stopped before)
  "tool_error",  # the code pool itself raised (not a failing program)
  "abort",  # the engine aborted the request
)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """Per-request sampling settings (mapped 1:1 onto SGLang's ``sampling_params``).

  max_new_tokens: generation limit for this request (>= 1).
  temperature: 0 = greedy.
  top_p: nucleus mass in (0, 1]; 1 = off.
  top_k: -1 = off (SGLang's convention), else >= 1.
  stop_token_ids: generation stops after emitting any of these ids (the id is kept in output).
  stop: stop sequences, each a string (engines encode it) or a tuple of token ids.
  seed: per-request seed (SGLang ``sampling_seed``); None = engine chooses.
  """

  max_new_tokens: int
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = -1
  stop_token_ids: tuple[int, ...] = ()
  stop: tuple[str | tuple[int, ...], ...] = ()
  seed: int | None = None

  def __post_init__(self):
    object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
    stop = (self.stop,) if isinstance(self.stop, str) else self.stop
    object.__setattr__(
      self, "stop", tuple(s if isinstance(s, str) else tuple(int(t) for t in s) for s in stop)
    )
    if (
      isinstance(self.max_new_tokens, bool)
      or not isinstance(self.max_new_tokens, int)
      or self.max_new_tokens < 1
    ):
      raise ValueError(
        f"SamplingParams.max_new_tokens: expected an int >= 1, got {self.max_new_tokens!r}"
      )
    if not self.temperature >= 0:
      raise ValueError(f"SamplingParams.temperature: expected >= 0, got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"SamplingParams.top_p: expected in (0, 1], got {self.top_p}")
    if not (self.top_k == -1 or self.top_k >= 1):
      raise ValueError(f"SamplingParams.top_k: expected -1 (off) or >= 1, got {self.top_k}")
    if any(len(s) == 0 for s in self.stop):
      raise ValueError("SamplingParams.stop: empty stop sequence")


@dataclasses.dataclass(frozen=True)
class GenerateRequest:
  """One generation request: prompt ids [T] + sampling; ``rid`` names it for targeted aborts."""

  input_ids: Sequence[int]
  sampling: SamplingParams
  rid: str | None = None


@dataclasses.dataclass(frozen=True)
class GenerateResult:
  """Engine output for one request.

  output_ids: generated ids, including the stop token that ended generation.
  logprobs: log-probability of each output id under the sampling engine ([len(output_ids)]).
  finish_reason: "stop" | "length" | "abort".
  weight_version: the oldest weight version that produced any of these tokens.
  weight_versions: per-token versions when the engine knows them (None = all ``weight_version``).
  prefill_tokens: input tokens the engine computed for this request, i.e. its input minus what
      it reused from a cache (a multi-turn trajectory that keeps its cache prefills only the
      appended tool turn); None = the engine does not say.
  """

  output_ids: list[int]
  logprobs: list[float]
  finish_reason: str
  weight_version: int = 0
  weight_versions: Sequence[int] | None = None
  prefill_tokens: int | None = None

  def __post_init__(self):
    if self.finish_reason not in FINISH_REASONS:
      raise ValueError(
        f"GenerateResult.finish_reason: expected one of {FINISH_REASONS}, "
        f"got {self.finish_reason!r}"
      )
    if len(self.logprobs) != len(self.output_ids):
      raise ValueError(
        f"GenerateResult: {len(self.logprobs)} logprobs for {len(self.output_ids)} output ids"
      )
    if self.weight_versions is not None and len(self.weight_versions) != len(self.output_ids):
      raise ValueError(
        f"GenerateResult: {len(self.weight_versions)} weight_versions for "
        f"{len(self.output_ids)} output ids"
      )

  def token_versions(self) -> list[int]:
    """Per-token weight versions ([len(output_ids)])."""
    if self.weight_versions is not None:
      return [int(v) for v in self.weight_versions]
    return [int(self.weight_version)] * len(self.output_ids)


@runtime_checkable
class Engine(Protocol):
  """What the agent loop needs from a rollout engine."""

  async def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]: ...

  async def update_weights(self, config: Any, params: Any, version: int | None = None) -> None: ...

  @property
  def weight_version(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class ToolCallRecord:
  """One executed (or failed-to-parse) tool call.

  status: an ExecResult status ("ok", "error", "timeout", "memory_limit", "output_limit",
      "internal_error", "session_lost") or "parse_error" for a <tool_call> whose JSON did not
      parse.
  duration_s: wall time of the call as the pool reports it (0 for parse errors).
  code: the code argument ("" for parse errors).
  output_text: the text placed inside <tool_response> for this call.
  turn: index of the assistant turn that issued the call.
  """

  status: str
  duration_s: float
  code: str
  output_text: str
  turn: int = 0


@dataclasses.dataclass
class Trajectory:
  """One multi-turn rollout, everything the learner and the rewards need.

  prompt_ids: [P] the rendered prompt (system + user + ``<|im_start|>assistant\\n<reason>``).
  response_ids: [R] all tokens after the prompt: generated ids and tool-turn template ids.
  loss_mask: [R] 1 = model-generated, 0 = tool/template tokens.
  logprobs: [R] sampling-engine log-probs, 0.0 where loss_mask is 0.
  weight_versions: [R] weight version that produced each token; a tool-turn token carries the
      version of the generated token just before it (the turn that called the tool).
  num_turns: number of assistant turns (generate calls).
  tool_calls: every tool call, in order.
  finish_reason: one of TRAJECTORY_FINISH_REASONS.
  num_answer_tags: number of ``<answer>`` tags in the response text.
  response_text: decoded response_ids, for the reward only (never re-encoded).
  problem_index / sample_index: position in the run_agent_loop batch (for grouping).
  prefill_tokens: input tokens the engine computed over all turns (the rest came from its
      cache); equals the trajectory's new tokens when every turn reuses the previous one's
      cache, and approaches turns x length when none does. None = the engine does not say.
  """

  prompt_ids: list[int]
  response_ids: list[int]
  loss_mask: list[int]
  logprobs: list[float]
  weight_versions: list[int]
  num_turns: int
  tool_calls: list[ToolCallRecord]
  finish_reason: str
  num_answer_tags: int = 0
  response_text: str = ""
  problem_index: int = 0
  sample_index: int = 0
  prefill_tokens: int | None = None

  def __post_init__(self):
    n = len(self.response_ids)
    for name in ("loss_mask", "logprobs", "weight_versions"):
      if len(getattr(self, name)) != n:
        raise ValueError(
          f"Trajectory.{name}: length {len(getattr(self, name))} != len(response_ids) {n}"
        )

  @property
  def num_generated_tokens(self) -> int:
    return int(sum(self.loss_mask))
