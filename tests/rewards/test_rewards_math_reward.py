"""Answer extraction and equivalence (math-verify in a worker process, integer fast path)."""

import asyncio
import json
import pathlib
import time

import pytest

from rstar_jax.rewards import math_reward, verify_worker

# (pred, gold, expected)
CASES = [
  # integers: commas, leading zeros, signs, LaTeX spacing
  ("1,000", "1000", True),
  ("1{,}000", "1000", True),
  ("007", "7", True),
  ("+5", "5", True),
  ("-3", "-3", True),
  ("-3", "3", False),
  ("1\\,000", "1000", True),
  ("12,345,678", "12345678", True),
  ("1000", "100", False),
  ("$42$", "42", True),
  ("0", "-0", True),
  ("10", "010", True),
  # fractions and \frac / \dfrac
  ("\\frac{1}{2}", "0.5", True),
  ("\\dfrac{1}{2}", "\\frac12", True),
  ("\\tfrac{3}{4}", "0.75", True),
  ("\\frac{2}{4}", "\\frac{1}{2}", True),
  ("1/2", "\\frac{1}{2}", True),
  ("\\frac{1}{3}", "0.33", False),
  ("\\frac{3}{2}", "\\frac{2}{3}", False),
  ("-\\frac{1}{2}", "\\frac{-1}{2}", True),
  ("\\frac{4}{2}", "2", True),
  # decimals
  ("0.25", "\\frac14", True),
  ("2.50", "2.5", True),
  ("3.0", "3", True),
  ("0.1", "0.01", False),
  # percentages
  ("50\\%", "50", True),
  ("25\\%", "25", True),
  ("30\\%", "40", False),
  # pi
  ("2\\pi", "2\\pi", True),
  ("\\frac{\\pi}{2}", "\\pi/2", True),
  ("\\pi", "2\\pi", False),
  ("\\frac{3\\pi}{4}", "\\frac{3}{4}\\pi", True),
  # radicals
  ("2\\sqrt{2}", "\\sqrt{8}", True),
  ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}", True),
  ("\\sqrt{2}", "\\sqrt{3}", False),
  ("3\\sqrt{5}", "\\sqrt{45}", True),
  ("\\sqrt[3]{8}", "2", True),
  # negatives
  ("-\\sqrt{2}", "\\sqrt{2}", False),
  ("-7", "-7.0", True),
  ("-0.5", "-\\frac{1}{2}", True),
  # intervals
  ("(1,2]", "(1,2]", True),
  ("[1,2)", "(1,2]", False),
  ("(-\\infty, 3)", "(-\\infty,3)", True),
  ("[0,1]", "[0,2]", False),
  # sets and tuples
  ("\\{1,2\\}", "\\{2,1\\}", True),
  ("\\{1,2,3\\}", "\\{1,2\\}", False),
  ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})", True),
  ("(1,2)", "(2,1)", False),
  # text answers
  ("\\text{Monday}", "Monday", True),
  ("\\text{(B)}", "B", True),
  ("\\text{Tuesday}", "Monday", False),
  ("\\text{(C)}", "\\text{(B)}", False),
  # expressions and nested braces
  ("x^2+2x+1", "(x+1)^2", True),
  ("\\frac{1}{\\frac{1}{2}}", "2", True),
  ("{{{5}}}", "5", True),
  ("\\frac{\\sqrt{\\frac{1}{4}}}{1}", "\\frac12", True),
  ("x+1", "x-1", False),
  ("10^{10}", "10000000000", True),
  ("2^{10}", "1024", True),
  ("2^{10}", "1000", False),
  # degenerate
  ("", "3", False),
  (None, "3", False),
]


@pytest.fixture(scope="module")
def verifier():
  with math_reward.Verifier(timeout_s=5.0) as v:
    yield v


def test_has_enough_cases():
  assert len(CASES) >= 60 and sum(not c[2] for c in CASES) >= 15


@pytest.mark.parametrize("pred,gold,expected", CASES)
def test_equivalence(verifier, pred, gold, expected):
  assert math_reward.is_equivalent(pred, gold, verifier=verifier) is expected


@pytest.mark.parametrize(
  "text,mode,want",
  [
    ("<answer>so \\boxed{\\frac{1}{\\{2\\}}}</answer>", "answer_tag", "\\frac{1}{\\{2\\}}"),
    ("\\boxed{1} then <answer>\\boxed{2} or \\boxed{3}</answer>", "answer_tag", "3"),
    ("\\boxed{1} <answer>none</answer> \\boxed{9}", "answer_tag", None),
    ("\\boxed{1} <answer>none</answer> \\boxed{9}", "anywhere", "9"),
    ("\\boxed{7} no tags", "answer_tag", None),
    ("\\boxed{7} no tags", "anywhere", "7"),
    ("<answer>\\boxed{a}</answer> later <answer>\\boxed{b}</answer>", "answer_tag", "b"),
    ("<answer>truncated \\boxed{12}", "answer_tag", "12"),
    ("<answer>\\boxed{\\frac{1}{2}</answer>", "answer_tag", None),  # unbalanced
    ("<answer>\\boxed 5</answer>", "answer_tag", "5"),
    ("<answer>\\fbox{x^{2}}</answer>", "answer_tag", "x^{2}"),
    ("<answer>\\boxed{}</answer>", "answer_tag", None),
    ("<answer>\\boxedfoo{3}</answer>", "answer_tag", None),
  ],
)
def test_extract_answer(text, mode, want):
  assert math_reward.extract_answer(text, mode) == want


def test_score(verifier):
  good = "<reason>...</reason><answer>The answer is \\boxed{\\dfrac{1}{2}}.</answer>"
  assert math_reward.score(good, "0.5", verifier=verifier) == 1.0
  assert math_reward.score(good, "0.6", verifier=verifier) == 0.0
  assert math_reward.score("\\boxed{0.5}", "0.5", verifier=verifier) == 0.0
  assert math_reward.score("\\boxed{0.5}", "0.5", mode="anywhere", verifier=verifier) == 1.0


def test_pathological_inputs_return_zero_within_bound(verifier):
  bound = 2.0
  slack = 30.0  # process kill + worker restart on 2 busy cores
  tower = "2^{2^{2^{2^{2^{2^{2^{100}}}}}}}"
  huge = "1+" * 50_000 + "1"  # 100 KB
  cases = [
    dict(pred=tower, gold="7"),
    dict(pred="9^{9^{9^{9^{9}}}}", gold="9^{9^{9^{9^{8}}}}"),
    dict(pred=huge, gold="50001"),
  ]
  for c in cases:
    t0 = time.monotonic()
    assert (
      math_reward.is_equivalent(c["pred"], c["gold"], timeout_s=bound, verifier=verifier) is False
    )
    assert time.monotonic() - t0 < bound + slack
  # The 100 KB answer also stays bounded when the length guard is lifted.
  t0 = time.monotonic()
  assert (
    math_reward.is_equivalent(huge, "2", timeout_s=bound, verifier=verifier, max_chars=10**6)
    is False
  )
  assert time.monotonic() - t0 < bound + slack
  unbalanced = "<answer>\\boxed{\\frac{1}{2}" + "{" * 1000 + "</answer>"
  assert math_reward.score(unbalanced, "0.5", verifier=verifier) == 0.0
  # The worker is replaced after timeouts and keeps working.
  assert verifier.num_timeouts >= 1
  assert math_reward.is_equivalent("\\frac{6}{4}", "1.5", verifier=verifier) is True


def test_score_async_with_runner_and_default(verifier):
  calls = []

  async def thread_runner(fn, *args, timeout_s):
    # math-verify is called with its signal timeouts off, so it also works off the main thread.
    calls.append((fn, timeout_s))
    return await asyncio.wait_for(asyncio.to_thread(fn, *args), timeout_s)

  async def failing_runner(fn, *args, timeout_s):
    raise TimeoutError("worker timed out")

  async def main():
    text = "<answer>\\boxed{\\sqrt{8}}</answer>"
    # The first call imports math-verify and sympy in this process: over the default 5 s on a
    # loaded machine (two test workers), so the thread runner gets a generous deadline.
    return (
      await math_reward.score_async(text, "2\\sqrt2", thread_runner, timeout_s=120.0),
      await math_reward.score_async(text, "3", thread_runner, timeout_s=120.0),
      await math_reward.score_async(text, "2\\sqrt2", failing_runner),
      await math_reward.score_async(text, "2\\sqrt2", verifier=verifier),
    )

  assert asyncio.run(main()) == (1.0, 0.0, 0.0, 1.0)
  assert calls == [(verify_worker.verify_strings, 120.0)] * 2


MATH500 = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data" / "math500.jsonl"


@pytest.mark.skipif(not MATH500.exists(), reason=f"{MATH500} not present (optional test data)")
def test_math500_reference_solutions(verifier):
  rows = [json.loads(l) for l in MATH500.read_text().splitlines()[:40]]
  for r in rows:
    sol = r["answer"]
    final = sol[sol.rfind("The answer is:") + len("The answer is:") :].strip()
    body = sol[: sol.rfind("The answer is:")]
    pred = math_reward.extract_answer(body, mode="anywhere")
    assert pred == final, (pred, final)
    wrapped = f"<reason>{body}</reason><answer>\\boxed{{{final}}}</answer>"
    assert math_reward.score(wrapped, final, verifier=verifier) == 1.0
