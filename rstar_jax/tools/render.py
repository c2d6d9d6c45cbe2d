"""Renders an ExecResult into the text placed inside <tool_response> ... </tool_response>.

Format follows the released rStar2 code: a success/failure header, then the
non-empty fields. The whole body is middle-truncated to `max_chars` (verl's
`tool_response_truncate_side = middle`), so the header and the end of a traceback survive.

Tool output is untrusted text that is later tokenized together with the chat template, and a
tokenizer maps the text of a special token (`<|im_end|>`, `</tool_response>`, ...) to the real
special token. So stdout/stderr are escaped first (`escape_special_tokens`): a zero-width space
(U+200B) goes after the `<` of anything shaped like a special token (`<|...|>`, `<name>`,
`</name>`) and inside any extra token string given, so code output can never end the tool turn
or forge an assistant turn; the text still reads the same to the model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from rstar_jax.tools.code_pool import FAILURE_STATUSES, ExecResult

TRUNCATION_MARKER = "...(truncated)..."
ZERO_WIDTH_SPACE = "\u200b"
# `<|anything|>` (ChatML / Qwen control tokens) and `<tag>` / `</tag>` (tool_call, tool_response,
# think, answer, ...): every special-token shape of the Qwen family and of this project's BPE.
_SPECIAL_SHAPED = re.compile(r"<(?=\|[^<>\n]{0,64}\|>|/?[A-Za-z_][\w.\-]{0,64}>)")


def escape_special_tokens(text: str, extra_tokens: Iterable[str] = ()) -> str:
  """`text` with a zero-width space inside every special-token-shaped substring.

  extra_tokens: more literal token strings to break (e.g. `tokenizer.all_special_tokens` when
  a tokenizer has specials of another shape).
  """
  text = _SPECIAL_SHAPED.sub("<" + ZERO_WIDTH_SPACE, text)
  for tok in extra_tokens:
    if len(tok) >= 2 and tok in text:
      text = text.replace(tok, tok[0] + ZERO_WIDTH_SPACE + tok[1:])
  return text


_REASONS = {
  "error": "error",
  "timeout": "timeout: execution exceeded the time limit",
  "memory_limit": "memory_limit: execution exceeded the memory limit",
  "output_limit": "output_limit: output exceeded the size limit",
  "internal_error": "internal_error",
  "session_lost": (
    "session_lost: the sandbox holding this session's variables failed; earlier definitions and "
    "imports are gone, re-run what you need"
  ),
  "parse_error": "parse_error: the tool call is not valid JSON with a 'code' argument",
}


def truncate_middle(text: str, max_chars: int, marker: str = TRUNCATION_MARKER) -> str:
  """Keeps the first and last characters of `text` so that the result has <= max_chars."""
  if max_chars < 0:
    raise ValueError(f"max_chars must be >= 0, got {max_chars}")
  if len(text) <= max_chars:
    return text
  if max_chars <= len(marker):
    return text[:max_chars]
  keep = max_chars - len(marker)
  head = (keep + 1) // 2
  tail = keep - head
  return text[:head] + marker + (text[-tail:] if tail else "")


def render_tool_response(
  result: ExecResult,
  max_chars: int = 2048,
  *,
  show_time: bool = True,
  extra_special_tokens: Iterable[str] = (),
) -> str:
  """(ExecResult, max_chars) -> the body text of one <tool_response>.

  ok:      "Tool call success\\nstdout: ...\\nstderr: ...\\nexecution time: 0.01s"
  failure: "Tool call failure\\nreason: <status...>\\nstdout: ...\\nstderr: ...\\n..."
  Empty stdout/stderr lines are omitted. stdout/stderr pass through `escape_special_tokens`.
  """
  status = result.status
  if status != "ok" and status not in FAILURE_STATUSES:
    raise ValueError(f"render_tool_response: unknown status {status!r}")
  lines = ["Tool call success" if status == "ok" else "Tool call failure"]
  if status != "ok":
    lines.append(f"reason: {_REASONS[status]}")
  extra = tuple(extra_special_tokens)
  if result.stdout:
    lines.append(f"stdout: {escape_special_tokens(result.stdout.rstrip(chr(10)), extra)}")
  if result.stderr:
    lines.append(f"stderr: {escape_special_tokens(result.stderr.rstrip(chr(10)), extra)}")
  if status == "ok" and not result.stdout and not result.stderr:
    lines.append("stdout: (no output)")
  if show_time:
    lines.append(f"execution time: {result.duration_s:.2f}s")
  return truncate_middle("\n".join(lines), max_chars)
