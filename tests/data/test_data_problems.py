"""Problem-set JSONL loading: round trip, alias, and errors that name file, line and field."""

import json

import pytest

from rstar_jax.data.jsonl import DataError
from rstar_jax.data.problems import Problem, load_problems, write_jsonl


def _write(tmp_path, lines, name="set.jsonl"):
  p = tmp_path / name
  p.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return p


def test_round_trip_keeps_every_field(tmp_path):
  probs = [
    Problem(
      "Compute 2 * 3.", "6", family="mul", params={"a": 2, "b": 3}, solution_code="print(2 * 3)"
    ),
    Problem("Wie viel ist 7 − 2?", "5"),
  ]
  path = tmp_path / "out" / "p.jsonl"
  assert write_jsonl(path, probs) == 2
  assert load_problems(path) == probs
  assert "−" in path.read_text(encoding="utf-8")  # non-ASCII kept verbatim


def test_question_alias_int_answer_and_blank_lines(tmp_path):
  path = _write(
    tmp_path,
    [
      json.dumps({"question": "1+1?", "answer": 2}),
      "",
      json.dumps({"problem": "x", "answer": "-3"}),
    ],
  )
  probs = load_problems(path)
  assert [p.problem for p in probs] == ["1+1?", "x"]
  assert [p.answer for p in probs] == ["2", "-3"]
  assert load_problems(path, require_integer_answer=True) == probs


@pytest.mark.parametrize(
  "bad_line, field, words",
  [
    ('{"problem": "a", "answer": ', None, "invalid JSON"),
    ("[1, 2]", None, "JSON object"),
    ('{"answer": "1"}', "problem", "missing"),
    ('{"problem": "a"}', "answer", "missing"),
    ('{"problem": 5, "answer": "1"}', "problem", "expected a string, got int"),
    ('{"question": null, "answer": "1"}', "question", "got null"),
    ('{"problem": "a", "answer": 1.5}', "answer", "got float"),
    ('{"problem": "a", "answer": true}', "answer", "got bool"),
    ('{"problem": "a", "answer": ""}', "answer", "non-empty"),
    ('{"problem": "  ", "answer": "1"}', "problem", "non-empty"),
    ('{"problem": "a", "question": "b", "answer": "1"}', "problem", "differ"),
    ('{"problem": "a", "answer": "1", "params": [1]}', "params", "expected an object"),
    ('{"problem": "a", "answer": "1", "solution_code": 3}', "solution_code", "expected a string"),
  ],
)
def test_bad_line_error_names_file_line_field(tmp_path, bad_line, field, words):
  good = json.dumps({"problem": "ok", "answer": "1"})
  path = _write(tmp_path, [good, "", bad_line, good])
  with pytest.raises(DataError) as ei:
    load_problems(path)
  err = ei.value
  assert (err.path, err.line, err.field) == (str(path), 3, field)
  msg = str(err)
  assert msg.startswith(f"{path}:3")
  assert words in msg
  if field:
    assert f"field '{field}'" in msg


def test_require_integer_answer_rejects_non_integer(tmp_path):
  path = _write(tmp_path, [json.dumps({"problem": "a", "answer": "1/2"})])
  assert load_problems(path)[0].answer == "1/2"
  with pytest.raises(DataError, match=r":1: field 'answer': expected an integer, got '1/2'"):
    load_problems(path, require_integer_answer=True)


def test_problem_validates_types():
  with pytest.raises(TypeError, match="Problem.answer"):
    Problem("q", 3)
  with pytest.raises(ValueError, match="Problem.problem"):
    Problem("", "3")
