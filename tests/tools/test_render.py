"""Rendering of ExecResult into the <tool_response> body and middle truncation."""
import pytest

from rstar_jax.tools.code_pool import ExecResult, FAILURE_STATUSES
from rstar_jax.tools.render import TRUNCATION_MARKER, render_tool_response, truncate_middle


def test_success_body():
  text = render_tool_response(ExecResult("ok", "4\n", "", 0.0123), 1000)
  assert text == "Tool call success\nstdout: 4\nexecution time: 0.01s"


def test_success_without_output_and_with_stderr():
  assert render_tool_response(ExecResult("ok", "", "", 0.5), 1000) == \
      "Tool call success\nstdout: (no output)\nexecution time: 0.50s"
  text = render_tool_response(ExecResult("ok", "a\n", "warn\n", 0.0), 1000, show_time=False)
  assert text == "Tool call success\nstdout: a\nstderr: warn"


@pytest.mark.parametrize("status", sorted(FAILURE_STATUSES))
def test_failure_bodies_name_the_reason(status):
  r = ExecResult(status, "partial\n", "Traceback ...\nValueError: x\n", 1.0)
  text = render_tool_response(r, 1000)
  lines = text.split("\n")
  assert lines[0] == "Tool call failure"
  assert lines[1].startswith(f"reason: {status}")
  assert "stdout: partial" in text and text.endswith("execution time: 1.00s")
  assert "ValueError: x" in text


def test_unknown_status_rejected():
  with pytest.raises(ValueError, match="unknown status 'weird'"):
    render_tool_response(ExecResult("weird"), 100)


@pytest.mark.parametrize("n,limit", [(10, 20), (100, 40), (1000, 256), (257, 256), (50, 18)])
def test_truncate_middle_keeps_both_ends(n, limit):
  text = "".join(chr(ord("a") + i % 26) for i in range(n))
  out = truncate_middle(text, limit)
  assert len(out) <= limit
  if n <= limit:
    assert out == text
  else:
    assert len(out) == limit and TRUNCATION_MARKER in out
    head, tail = out.split(TRUNCATION_MARKER)
    assert text.startswith(head) and text.endswith(tail)
    assert abs(len(head) - len(tail)) <= 1


def test_truncate_tiny_limits():
  assert truncate_middle("abcdef" * 10, 5) == "abcde"
  assert truncate_middle("abc", 0) == ""
  with pytest.raises(ValueError, match="max_chars must be >= 0"):
    truncate_middle("abc", -1)


def test_long_traceback_keeps_header_and_final_error():
  r = ExecResult("error", "", "Traceback\n" + "  frame\n" * 500 + "ZeroDivisionError: boom\n", 0.1)
  text = render_tool_response(r, 256)
  assert len(text) == 256
  assert text.startswith("Tool call failure\nreason: error")
  assert "ZeroDivisionError: boom\nexecution time: 0.10s" in text
