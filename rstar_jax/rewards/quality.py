"""Trajectory quality signals for RoC: p_err (tool failures) and p_format (answer tags).

p_total = p_err + p_format is the penalty `rstar_jax.rl.roc.roc_downsample` uses to rank
correct rollouts (rStar2-Agent §2.2.3; released code: microsoft/rStar rstar2_agent/down_sample/roc.py; docs/fidelity.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MODES = ("paper", "released")
OK_STATUS = "ok"
# ExecResult.status values of the code pool (session_lost: the tool node holding the session
# died), plus "parse_error" from the agent loop for a <tool_call> whose JSON did not parse.
KNOWN_STATUSES = frozenset(
  {
    "ok",
    "error",
    "timeout",
    "memory_limit",
    "output_limit",
    "internal_error",
    "session_lost",
    "parse_error",
  }
)
NO_CALL_P_ERR = 0.5

_ANSWER_PAIR = re.compile(r"<answer>.*?</answer>", re.DOTALL)
_ASSISTANT_TURN = re.compile(r"<\|im_start\|>assistant.*?<\|im_end\|>", re.DOTALL)


def _check_mode(fn: str, mode: str) -> None:
  if mode not in MODES:
    raise ValueError(f"{fn}: mode must be one of {MODES}, got {mode!r}")


def p_err(
  tool_statuses: Sequence[str],
  mode: str = "paper",
  tool_response_texts: Sequence[str] | None = None,
) -> float:
  """Share of failed tool calls; 0.5 for a trajectory without tool calls.

  paper: a call fails when its status is anything but "ok" (error, timeout, memory_limit,
      output_limit, internal_error, session_lost, parse_error).
  released: a call "fails" when the case-insensitive substring "error" occurs in its rendered
      <tool_response> text (so timeouts are missed and printed words "error" count), which
      needs ``tool_response_texts``.
  """
  _check_mode("p_err", mode)
  if mode == "released":
    if tool_response_texts is None:
      raise ValueError("p_err(mode='released') needs tool_response_texts (one per call)")
    texts = list(tool_response_texts)
    if not texts:
      return NO_CALL_P_ERR
    return sum("error" in t.lower() for t in texts) / len(texts)
  statuses = list(tool_statuses)
  unknown = sorted({s for s in statuses if s not in KNOWN_STATUSES})
  if unknown:
    raise ValueError(
      f"p_err: unknown tool status {unknown}; expected one of {sorted(KNOWN_STATUSES)}"
    )
  if not statuses:
    return NO_CALL_P_ERR
  return sum(s != OK_STATUS for s in statuses) / len(statuses)


def p_format(response_text: str, num_turns: int, mode: str = "paper") -> float:
  """Answer-format penalty.

  paper: 1 when the response has no ``<answer>``; else min(1, (#<answer> - 1) / num_turns)
      with num_turns = number of assistant turns (>= 1). One clean answer scores 0.
  released: 1.0 when ``<answer>`` or ``</answer>`` is missing or the open/close counts differ
      from the number of closed pairs; else min(1, (#pairs - 1) / turns) where turns = the
      regex matches of ``<|im_start|>assistant.*?<|im_end|>`` in the response text, so the
      text must keep special tokens. The first turn's header sits in the prompt, hence a
      single-turn trajectory has turns = 0 and gets 1.0 (released roc.py behaviour). ``num_turns`` is not
      used in this mode.
  """
  _check_mode("p_format", mode)
  n_open = response_text.count("<answer>")
  if mode == "paper":
    if num_turns < 1:
      raise ValueError(f"p_format: num_turns must be >= 1 (assistant turns), got {num_turns}")
    if n_open == 0:
      return 1.0
    return min(1.0, (n_open - 1) / num_turns)
  n_close = response_text.count("</answer>")
  n_pairs = len(_ANSWER_PAIR.findall(response_text))
  if n_open == 0 or n_close == 0 or n_open != n_pairs or n_close != n_pairs:
    return 1.0
  turns = len(_ASSISTANT_TURN.findall(response_text))
  if turns == 0:
    return 1.0
  return min(1.0, (n_pairs - 1) / turns)


def p_total(
  tool_statuses: Sequence[str],
  response_text: str,
  num_turns: int,
  mode: str = "paper",
  tool_response_texts: Sequence[str] | None = None,
) -> float:
  """p_err + p_format in one call."""
  return p_err(tool_statuses, mode, tool_response_texts) + p_format(response_text, num_turns, mode)
