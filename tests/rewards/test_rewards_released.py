"""The released rStar2-Agent reward (mode="released"): one case per extraction rule that pays,
cases where the paper's answer_tag mode gives 0 but released pays, and its refusals."""

import asyncio

import pytest

from rstar_jax.rewards import math_reward, verify_worker


@pytest.fixture(scope="module")
def verifier():
  with math_reward.Verifier(timeout_s=5.0) as v:
    yield v


# (rule, response, gold, expected candidate); every response lacks <answer> tags, so the paper
# mode scores it 0 while the released reward pays.
RULE_CASES = [
  ("last boxed", "First \\boxed{3}, then so the answer is \\boxed{12}.", "12", "12"),
  ("fbox", "Checked: \\fbox{7}", "7", "7"),
  ("answer:", "Final answer: 12", "12", "12"),
  ("answer is", "The answer is 144", "144", "144"),
  ("answers are", "The answers are 5", "5", "5"),
  ("is the answer", "36 is the answer", "36", "36"),
  ("are the answers", "2 are the answers", "2", "2"),
  ("last '. ' then =", "We get x = 5. So we stop here", "5", "5"),
  ("be", "The total must be 42", "42", "42"),
  ("get", "Adding up we get 1000", "1000", "1000"),
  ("colon", "Result: 64", "64", "64"),
  ("is newline", "the count is\n17", "17", "17"),
  ("= after boxed", "\\boxed{n = 9}", "9", "9"),
  (
    "tool output",
    "<tool_call>{}</tool_call><tool_response>\nstdout: 250\n</tool_response>Answer: 250",
    "250",
    "250",
  ),
]


@pytest.mark.parametrize("rule,text,gold,cand", RULE_CASES, ids=[c[0] for c in RULE_CASES])
def test_each_rule_extracts_and_pays(verifier, rule, text, gold, cand):
  matched, got = math_reward.extract_released(text)
  assert matched and got == cand
  assert math_reward.score(text, gold, mode="answer_tag", verifier=verifier) == 0.0
  assert math_reward.score(text, gold, mode="released", verifier=verifier) == 1.0
  assert math_reward.score(text, str(int(gold) + 1), mode="released", verifier=verifier) == 0.0


def test_math_verify_over_full_text_pays_where_extraction_fails(verifier):
  text = "The value is $\\frac{3}{4}$ and that is final"
  matched, cand = math_reward.extract_released(text)
  assert (matched, cand) == (False, "final")  # rule 5 lands on a word: no digit
  assert math_reward.score(text, "0.75", mode="anywhere", verifier=verifier) == 0.0
  assert math_reward.score(text, "\\frac{3}{4}", mode="released", verifier=verifier) == 1.0
  assert math_reward.score(text, "\\frac{2}{3}", mode="released", verifier=verifier) == 0.0
  assert verify_worker.verify_text(text, "\\frac{3}{4}")
  assert not verify_worker.verify_text("no math here", "3")


def test_specials_dropped_and_no_digit_unmatched(verifier):
  assert math_reward.extract_released("the answer is twelve") == (False, "twelve")
  text = "<|im_start|>assistant\nso the answer is 12<|im_end|>"
  assert math_reward.released_text(text) == "assistant\nso the answer is 12"
  assert math_reward.score(text, "12", mode="released", verifier=verifier) == 1.0
  assert math_reward.score("no answer at all", "12", mode="released", verifier=verifier) == 0.0


def test_escape_mangled_boxed_is_repaired(verifier):
  # 'so the answer is \boxed{12}.' typed without a raw string: "\b" is a backspace.
  mangled = "so the answer is \boxed{12}."
  assert "\x08" in mangled
  assert math_reward.score(mangled, "12", mode="released", verifier=verifier) == 1.0
  assert math_reward.released_text("\x0crac{1}{2} \x08 tab\t") == "\\frac{1}{2} \x08 tab\t"


def test_unknown_mode_is_one_line_error():
  with pytest.raises(ValueError, match="mode must be one of"):
    math_reward.score("x", "1", mode="prime")


def test_score_async_released(verifier):
  async def thread_runner(fn, *args, timeout_s):
    return await asyncio.to_thread(fn, *args)

  async def failing_runner(fn, *args, timeout_s):
    raise TimeoutError("killed")

  async def main():
    full = "The value is $\\frac{3}{4}$ and that is final"
    return (
      await math_reward.score_async("the answer is 12", "12", thread_runner, mode="released"),
      await math_reward.score_async(full, "\\frac34", thread_runner, mode="released"),
      await math_reward.score_async(full, "\\frac34", failing_runner, mode="released"),
      await math_reward.score_async(full, "\\frac34", mode="released", verifier=verifier),
    )

  assert asyncio.run(main()) == (1.0, 1.0, 0.0, 1.0)
