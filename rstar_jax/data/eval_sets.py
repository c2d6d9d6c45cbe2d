"""Evaluation sets in their public JSONL layouts (MATH-500, AIME 2024 / 2025).

Accepted per line (the field names of the public Hugging Face datasets):
  problem / question / Problem / Question   the problem text
  answer / Answer                           the gold: a final answer (string or integer), or a
                                            worked solution whose final answer is its last
                                            \\boxed{...} (MATH-500 as shipped with a solution text)
Examples: HuggingFaceH4/MATH-500 (problem, answer), HuggingFaceH4/aime_2024 (problem, answer),
Maxwell-Jia/AIME_2024 (Problem, Answer: int), opencompass/AIME2025 (question, answer).
"""

from __future__ import annotations

import os

from rstar_jax.data.jsonl import DataError, iter_jsonl, type_name
from rstar_jax.data.problems import Problem
from rstar_jax.rewards.math_reward import extract_answer

PROBLEM_KEYS = ("problem", "question", "Problem", "Question")
ANSWER_KEYS = ("answer", "Answer")


def _final_answer(text: str) -> str:
  if "\\boxed" not in text and "\\fbox" not in text:
    return text.strip()

  boxed = extract_answer(text, "anywhere")
  return boxed if boxed else text.strip()


def load_eval_problems(path: str | os.PathLike) -> list[Problem]:
  """Problems of an evaluation JSONL in any of the layouts above; errors name file, line
  and field."""
  out = []
  for lineno, rec in iter_jsonl(path):
    pkey = next((k for k in PROBLEM_KEYS if k in rec), None)
    akey = next((k for k in ANSWER_KEYS if k in rec), None)
    if pkey is None:
      raise DataError(
        path,
        lineno,
        "problem",
        f"missing (looked for {list(PROBLEM_KEYS)}); keys present: {sorted(rec)}",
      )
    if akey is None:
      raise DataError(
        path,
        lineno,
        "answer",
        f"missing (looked for {list(ANSWER_KEYS)}); keys present: {sorted(rec)}",
      )
    text, ans = rec[pkey], rec[akey]
    if not isinstance(text, str) or not text.strip():
      raise DataError(path, lineno, pkey, f"expected non-empty text, got {type_name(text)}")
    if isinstance(ans, bool) or not isinstance(ans, (str, int)) or not str(ans).strip():
      raise DataError(
        path,
        lineno,
        akey,
        f"expected a non-empty string or integer, got {type_name(ans)} ({ans!r})",
      )
    out.append(Problem(problem=text, answer=_final_answer(str(ans))))
  return out
