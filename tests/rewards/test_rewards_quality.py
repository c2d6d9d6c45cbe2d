"""p_err / p_format in paper and released modes."""

import pytest

from rstar_jax.rewards import quality


def test_p_err_paper():
  assert quality.p_err([]) == 0.5
  assert quality.p_err(["ok", "ok"]) == 0.0
  assert quality.p_err(["ok", "timeout", "parse_error", "error"]) == 0.75
  assert quality.p_err(["memory_limit", "output_limit", "internal_error"]) == 1.0
  with pytest.raises(ValueError, match="unknown tool status"):
    quality.p_err(["ok", "exploded"])


def test_p_err_released_substring():
  texts = [
    "Tool call success\nstdout: 4",
    "Traceback ... NameError: x",
    "Tool call failure / reason: worker_timeout",
    "I printed ERROR words",
  ]
  # Timeout text has no "error"; a successful print of "ERROR" counts (docs/reference.md §1.2).
  assert (
    quality.p_err(["ok", "error", "timeout", "ok"], mode="released", tool_response_texts=texts)
    == 0.5
  )
  assert quality.p_err([], mode="released", tool_response_texts=[]) == 0.5
  with pytest.raises(ValueError, match="tool_response_texts"):
    quality.p_err(["ok"], mode="released")


def test_p_format_paper():
  assert quality.p_format("no tags \\boxed{3}", 2) == 1.0
  assert quality.p_format("<answer>\\boxed{3}</answer>", 1) == 0.0
  assert quality.p_format("<answer>1</answer> <answer>2</answer>", 4) == 0.25
  assert quality.p_format("<answer>a</answer>" * 5, 2) == 1.0
  with pytest.raises(ValueError, match="num_turns"):
    quality.p_format("<answer>1</answer>", 0)


def test_p_format_released():
  turn = "<|im_start|>assistant\n<reason>r</reason><|im_end|>"
  one = "<answer>\\boxed{1}</answer><|im_end|>"
  assert quality.p_format(one, 1, mode="released") == 1.0  # single turn: regex finds 0 turns
  two_turns = "<tool_call>x</tool_call><|im_end|>\n" + turn + "\n" + turn
  assert quality.p_format(two_turns + "<answer>1</answer>", 3, mode="released") == 0.0
  assert (
    quality.p_format(two_turns + "<answer>1</answer><answer>2</answer>", 3, mode="released") == 0.5
  )
  assert quality.p_format(two_turns + "<answer>1</answer><answer>", 3, mode="released") == 1.0
  assert quality.p_format(two_turns, 3, mode="released") == 1.0
  assert quality.p_total(["ok"], "<answer>x</answer>", 1) == 0.0
  with pytest.raises(ValueError, match="mode"):
    quality.p_format("", 1, mode="x")
