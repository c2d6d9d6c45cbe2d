"""Chat-trajectory sets for SFT (cold start): loading, validation, writing.

A line is `{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...], ...}`.
Rules checked (each error names file, line and field path such as `messages[3].role`):
  * `messages` is a non-empty list of objects with a known `role` and a string `content`;
  * a `system` message may only come first;
  * a `tool` message must follow an assistant or another tool message (it answers a call);
  * at least one `assistant` message (SFT puts loss only on assistant tokens, so a trajectory
    without one trains nothing).
Other top-level fields (e.g. `problem`, `answer`, `num_tool_calls`) are kept in `extra`.
Extra keys inside a message are kept as well.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rstar_jax.data.jsonl import DataError, iter_jsonl, type_name, write_jsonl_records

ROLES = ("system", "user", "assistant", "tool")


@dataclasses.dataclass(frozen=True)
class ChatExample:
  """One SFT trajectory.

  Attributes:
      messages: the chat, each a dict with at least `role` and `content`.
      extra: the line's other top-level fields.
  """

  messages: tuple[Mapping[str, Any], ...]
  extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)

  @property
  def num_tool_calls(self) -> int:
    """Tool responses in the chat (one per executed call): ASTER's interaction density."""
    return sum(1 for m in self.messages if m["role"] == "tool")

  def to_json(self) -> dict:
    return {"messages": [dict(m) for m in self.messages], **dict(self.extra)}


def validate_messages(
  messages: Any, *, path: str | os.PathLike = "<messages>", lineno: int = 0
) -> tuple[dict, ...]:
  """Checks a message list against the rules above; returns it as a tuple of dicts."""
  if not isinstance(messages, list):
    raise DataError(path, lineno, "messages", f"expected a list, got {type_name(messages)}")
  if not messages:
    raise DataError(path, lineno, "messages", "expected at least one message, got an empty list")
  out = []
  prev_role = None
  for i, m in enumerate(messages):
    where = f"messages[{i}]"
    if not isinstance(m, dict):
      raise DataError(path, lineno, where, f"expected an object, got {type_name(m)}")
    if "role" not in m:
      raise DataError(path, lineno, f"{where}.role", f"missing; keys present: {sorted(m)}")
    role = m["role"]
    if not isinstance(role, str) or role not in ROLES:
      raise DataError(path, lineno, f"{where}.role", f"expected one of {list(ROLES)}, got {role!r}")
    if "content" not in m:
      raise DataError(path, lineno, f"{where}.content", f"missing; keys present: {sorted(m)}")
    if not isinstance(m["content"], str):
      raise DataError(
        path, lineno, f"{where}.content", f"expected a string, got {type_name(m['content'])}"
      )
    if role == "system" and i != 0:
      raise DataError(
        path, lineno, f"{where}.role", "a 'system' message may only be the first message"
      )
    if role == "tool" and prev_role not in ("assistant", "tool"):
      raise DataError(
        path,
        lineno,
        f"{where}.role",
        f"a 'tool' message must follow an 'assistant' or 'tool' message, got it after {prev_role!r}",
      )
    prev_role = role
    out.append(dict(m))
  if not any(m["role"] == "assistant" for m in out):
    raise DataError(
      path, lineno, "messages", "expected at least one 'assistant' message (nothing to train on)"
    )
  return tuple(out)


def example_from_record(
  rec: Mapping[str, Any], *, path: str | os.PathLike = "<record>", lineno: int = 0
) -> ChatExample:
  if "messages" not in rec:
    raise DataError(path, lineno, "messages", f"missing; keys present: {sorted(rec)}")
  messages = validate_messages(rec["messages"], path=path, lineno=lineno)
  return ChatExample(messages=messages, extra={k: v for k, v in rec.items() if k != "messages"})


def load_sft_jsonl(path: str | os.PathLike) -> list[ChatExample]:
  """Loads and validates a chat-trajectory JSONL file (blank lines skipped).

  Raises:
      DataError: naming file, line and field on bad JSON or a rule violation.
  """
  return [example_from_record(rec, path=path, lineno=lineno) for lineno, rec in iter_jsonl(path)]


def write_sft_jsonl(
  path: str | os.PathLike, examples: Iterable[ChatExample | Sequence[Mapping[str, Any]]]
) -> int:
  """Writes trajectories (ChatExample, or a bare message list) after validating each one."""

  def records():
    for i, ex in enumerate(examples):
      if not isinstance(ex, ChatExample):
        ex = ChatExample(messages=validate_messages(list(ex), path=path, lineno=i + 1))
      else:
        validate_messages(list(ex.messages), path=path, lineno=i + 1)
      yield ex.to_json()

  return write_jsonl_records(path, records())
