"""Renders an ExecResult into the text placed inside <tool_response> ... </tool_response>.

Format follows the released rStar2 code (SPEC §3.3): a success/failure header, then the
non-empty fields. The whole body is middle-truncated to `max_chars` (verl's
`tool_response_truncate_side = middle`), so the header and the end of a traceback survive.
"""
from __future__ import annotations

from rstar_jax.tools.code_pool import ExecResult, FAILURE_STATUSES

TRUNCATION_MARKER = "...(truncated)..."
_REASONS = {
    "error": "error",
    "timeout": "timeout: execution exceeded the time limit",
    "memory_limit": "memory_limit: execution exceeded the memory limit",
    "output_limit": "output_limit: output exceeded the size limit",
    "internal_error": "internal_error",
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


def render_tool_response(result: ExecResult, max_chars: int = 2048, *,
                         show_time: bool = True) -> str:
  """(ExecResult, max_chars) -> the body text of one <tool_response>.

  ok:      "Tool call success\\nstdout: ...\\nstderr: ...\\nexecution time: 0.01s"
  failure: "Tool call failure\\nreason: <status...>\\nstdout: ...\\nstderr: ...\\n..."
  Empty stdout/stderr lines are omitted.
  """
  status = result.status
  if status != "ok" and status not in FAILURE_STATUSES:
    raise ValueError(f"render_tool_response: unknown status {status!r}")
  lines = ["Tool call success" if status == "ok" else "Tool call failure"]
  if status != "ok":
    lines.append(f"reason: {_REASONS[status]}")
  if result.stdout:
    lines.append(f"stdout: {result.stdout.rstrip(chr(10))}")
  if result.stderr:
    lines.append(f"stderr: {result.stderr.rstrip(chr(10))}")
  if status == "ok" and not result.stdout and not result.stderr:
    lines.append("stdout: (no output)")
  if show_time:
    lines.append(f"execution time: {result.duration_s:.2f}s")
  return truncate_middle("\n".join(lines), max_chars)
