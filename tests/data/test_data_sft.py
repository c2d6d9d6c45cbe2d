"""Chat-trajectory JSONL for SFT: validation rules and file/line/field errors."""

import json

import pytest

from rstar_jax.data.jsonl import DataError
from rstar_jax.data.sft_data import ChatExample, load_sft_jsonl, write_sft_jsonl

GOOD = [
  {"role": "system", "content": "sys"},
  {"role": "user", "content": "Compute 2 * 3."},
  {"role": "assistant", "content": "<tool_call>{...}</tool_call>"},
  {"role": "tool", "content": "6"},
  {"role": "tool", "content": "again"},
  {"role": "assistant", "content": "<answer>\\boxed{6}</answer>"},
]


def test_round_trip_keeps_extra_fields(tmp_path):
  path = tmp_path / "sft.jsonl"
  ex = ChatExample(messages=tuple(GOOD), extra={"answer": "6", "num_tool_calls": 2})
  assert write_sft_jsonl(path, [ex, GOOD[1:3]]) == 2
  got = load_sft_jsonl(path)
  assert got[0] == ex
  assert got[0].num_tool_calls == 2
  assert got[1].messages == tuple(GOOD[1:3]) and got[1].extra == {}


def _one(tmp_path, rec):
  path = tmp_path / "bad.jsonl"
  good = json.dumps({"messages": GOOD})
  path.write_text(
    good + "\n" + (rec if isinstance(rec, str) else json.dumps(rec)) + "\n", encoding="utf-8"
  )
  return path


@pytest.mark.parametrize(
  "rec, field, words",
  [
    ('{"messages": [}', None, "invalid JSON"),
    ({"msgs": GOOD}, "messages", "missing"),
    ({"messages": "hi"}, "messages", "expected a list"),
    ({"messages": []}, "messages", "at least one message"),
    ({"messages": [GOOD[1], 7]}, "messages[1]", "expected an object"),
    ({"messages": [GOOD[1], {"content": "x"}]}, "messages[1].role", "missing"),
    (
      {"messages": [GOOD[1], {"role": "bot", "content": "x"}]},
      "messages[1].role",
      "expected one of",
    ),
    ({"messages": [GOOD[1], {"role": "assistant"}]}, "messages[1].content", "missing"),
    (
      {"messages": [GOOD[1], {"role": "assistant", "content": None}]},
      "messages[1].content",
      "got null",
    ),
    ({"messages": [GOOD[1], GOOD[0], GOOD[2]]}, "messages[1].role", "only be the first"),
    ({"messages": [GOOD[1], GOOD[3], GOOD[2]]}, "messages[1].role", "must follow"),
    ({"messages": [GOOD[0], GOOD[1]]}, "messages", "'assistant'"),
  ],
)
def test_bad_line_error_names_file_line_field(tmp_path, rec, field, words):
  path = _one(tmp_path, rec)
  with pytest.raises(DataError) as ei:
    load_sft_jsonl(path)
  err = ei.value
  assert (err.path, err.line, err.field) == (str(path), 2, field)
  assert str(err).startswith(f"{path}:2") and words in str(err)


def test_write_rejects_invalid_and_leaves_no_file(tmp_path):
  path = tmp_path / "out.jsonl"
  with pytest.raises(DataError, match=r"messages\[0\].role"):
    write_sft_jsonl(path, [GOOD, [{"role": "robot", "content": "x"}]])
  assert list(tmp_path.iterdir()) == []
