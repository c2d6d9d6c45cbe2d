"""Problem sets: the `Problem` record and JSONL loading/writing.

A problem-set line is `{"problem": str, "answer": str | int}`; `question` is accepted as an alias
of `problem` (reasoning-gym and many HF sets use it). Optional fields written by our generators:
`family` (str), `params` (object), `solution_code` (str, Python whose stdout is the answer).
Other fields are ignored. Answers are kept as strings: the verifier compares text with math-verify.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Any

from rstar_jax.data.jsonl import DataError, iter_jsonl, type_name, write_jsonl_records


@dataclasses.dataclass(frozen=True)
class Problem:
  """One problem with its gold answer.

  Attributes:
      problem: the question text shown to the model (after the chat template's user prefix).
      answer: gold answer as text (integers for RL data, rStar2-Agent paper).
      family: generator family name (e.g. "powmod", "rg/gcd"); "" for loaded external sets.
      params: the generator's parameters (JSON-safe); identifies the problem within its family.
      solution_code: reference Python program whose stdout (stripped) is `answer`; "" if none.
  """

  problem: str
  answer: str
  family: str = ""
  params: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)
  solution_code: str = ""

  def __post_init__(self):
    for name in ("problem", "answer", "family", "solution_code"):
      v = getattr(self, name)
      if not isinstance(v, str):
        raise TypeError(f"Problem.{name}: expected str, got {type_name(v)} ({v!r})")
    if not self.problem.strip():
      raise ValueError("Problem.problem: expected non-empty text, got an empty string")
    if not self.answer.strip():
      raise ValueError(f"Problem.answer: expected a non-empty answer for {self.problem!r}")
    if not isinstance(self.params, Mapping):
      raise TypeError(f"Problem.params: expected a mapping, got {type_name(self.params)}")

  @property
  def key(self) -> tuple:
    """(family, sorted params) — the identity used for split disjointness."""
    return (self.family, tuple(sorted((k, _freeze(v)) for k, v in self.params.items())))

  def to_json(self) -> dict:
    rec: dict[str, Any] = {"problem": self.problem, "answer": self.answer}
    if self.family:
      rec["family"] = self.family
    if self.params:
      rec["params"] = dict(self.params)
    if self.solution_code:
      rec["solution_code"] = self.solution_code
    return rec


def _freeze(v: Any) -> Any:
  if isinstance(v, Mapping):
    return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
  if isinstance(v, (list, tuple)):
    return tuple(_freeze(x) for x in v)
  return v


def _answer_text(path, lineno, value) -> str:
  # bool is an int subclass; `true` as an answer is almost certainly a broken line.
  if isinstance(value, bool) or not isinstance(value, (str, int)):
    raise DataError(
      path, lineno, "answer", f"expected a string or integer, got {type_name(value)} ({value!r})"
    )
  text = str(value)
  if not text.strip():
    raise DataError(path, lineno, "answer", "expected a non-empty answer, got an empty string")
  return text


def problem_from_record(
  rec: Mapping[str, Any], *, path: str | os.PathLike = "<record>", lineno: int = 0
) -> Problem:
  """Validates one decoded JSONL record; errors name `path`, `lineno` and the field."""
  has_p, has_q = "problem" in rec, "question" in rec
  if not (has_p or has_q):
    raise DataError(
      path,
      lineno,
      "problem",
      f"missing (also looked for alias 'question'); keys present: {sorted(rec)}",
    )
  if has_p and has_q and rec["problem"] != rec["question"]:
    raise DataError(
      path, lineno, "problem", "both 'problem' and 'question' are present and differ; keep one"
    )
  field = "problem" if has_p else "question"
  text = rec[field]
  if not isinstance(text, str):
    raise DataError(path, lineno, field, f"expected a string, got {type_name(text)} ({text!r})")
  if not text.strip():
    raise DataError(path, lineno, field, "expected non-empty text, got an empty string")
  if "answer" not in rec:
    raise DataError(path, lineno, "answer", f"missing; keys present: {sorted(rec)}")
  answer = _answer_text(path, lineno, rec["answer"])
  optional = {"family": str, "solution_code": str, "params": dict}
  values = {}
  for name, typ in optional.items():
    if name in rec and rec[name] is not None:
      if not isinstance(rec[name], typ):
        expected = "an object" if typ is dict else "a string"
        raise DataError(
          path, lineno, name, f"expected {expected}, got {type_name(rec[name])} ({rec[name]!r})"
        )
      values[name] = rec[name]
  return Problem(problem=text, answer=answer, **values)


def load_problems(
  path: str | os.PathLike, *, require_integer_answer: bool = False
) -> list[Problem]:
  """Loads a JSONL problem set.

  Args:
      path: JSONL file, one `{"problem"|"question": str, "answer": str|int, ...}` per line;
          blank lines are skipped.
      require_integer_answer: reject answers that are not integers (rStar2-Agent RL data rule; see also data.filters).

  Raises:
      DataError: naming file, line and field, on bad JSON, a missing field or a wrong type.
      FileNotFoundError: if `path` does not exist.
  """
  out = []
  for lineno, rec in iter_jsonl(path):
    p = problem_from_record(rec, path=path, lineno=lineno)
    if require_integer_answer and not is_integer_text(p.answer):
      raise DataError(path, lineno, "answer", f"expected an integer, got {p.answer!r}")
    out.append(p)
  return out


def is_integer_text(text: str) -> bool:
  t = text.strip()
  if t[:1] in "+-":
    t = t[1:]
  return t.isascii() and t.isdigit()


def write_jsonl(path: str | os.PathLike, problems: Iterable[Problem]) -> int:
  """Writes problems as JSONL (`Problem.to_json` per line); returns the number written."""
  return write_jsonl_records(path, (p.to_json() for p in problems))
