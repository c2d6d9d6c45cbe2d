"""Problem and SFT sets from JSONL, parquet and a local `datasets` directory (written here),
with the column mapping and one-line errors naming file, row and column."""

import json
import os

import pytest

from configs import rstar2_tiny_cpu
from rstar_jax.config import from_config_dict
from rstar_jax.data import formats
from rstar_jax.data.jsonl import DataError
from rstar_jax.pipelines import data_sources

# optional extra rstar_jax[data] (installed by the test extra, so CI runs these)
datasets = pytest.importorskip(
  "datasets", reason="datasets is not installed: pip install rstar_jax[data]"
)
pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed: pip install rstar_jax[data]")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed")

PROBLEMS = [
  {"prompt": "Compute 2 + 3.", "solution": 5, "source": "a"},
  {"prompt": "Compute 7 * 6.", "solution": "42", "source": "b"},
]
CHAT = [
  {"role": "user", "content": "Compute 2 + 3."},
  {
    "role": "assistant",
    "content": "call",
    "tool_calls": [{"function": {"name": "execute_python_code_with_standard_io"}}],
  },
  {"role": "tool", "content": "Tool call success\nstdout: 5"},
  {"role": "assistant", "content": "<answer>\\boxed{5}</answer>"},
]


def write_parquet(path, rows):
  pq.write_table(pa.Table.from_pylist(rows), path)
  return str(path)


def test_formats_are_detected_and_unknown_ones_refused(tmp_path):
  (tmp_path / "a.jsonl").write_text("")
  (tmp_path / "b.parquet").write_bytes(b"")
  (tmp_path / "d").mkdir()
  assert formats.resolve_format(tmp_path / "a.jsonl") == "jsonl"
  assert formats.resolve_format(tmp_path / "b.parquet") == "parquet"
  assert formats.resolve_format(tmp_path / "d") == "hf_dataset"
  assert formats.resolve_format(tmp_path / "b.parquet", "jsonl") == "jsonl"
  with pytest.raises(ValueError, match=r"^data.format: expected one of .*, got 'csv'$"):
    formats.resolve_format(tmp_path / "a.jsonl", "csv")
  with pytest.raises(FileNotFoundError, match="nothing is downloaded"):
    formats.resolve_format("HuggingFaceH4/MATH-500")
  with pytest.raises(formats.DataFormatError, match="not a readable parquet file"):
    formats.load_problem_set(tmp_path / "b.parquet")


def test_the_three_formats_give_the_same_problems(tmp_path):
  jsonl = tmp_path / "p.jsonl"
  jsonl.write_text("".join(json.dumps(r) + "\n" for r in PROBLEMS))
  parquet = write_parquet(tmp_path / "p.parquet", PROBLEMS[:1] + [dict(PROBLEMS[1], solution=42)])
  hf_dir = str(tmp_path / "hf")
  datasets.DatasetDict(
    {"train": datasets.Dataset.from_list([dict(r, solution=str(r["solution"])) for r in PROBLEMS])}
  ).save_to_disk(hf_dir)
  kw = dict(question_field="prompt", answer_field="solution")
  got = [formats.load_problem_set(p, **kw) for p in (jsonl, parquet, hf_dir)]
  assert got[0] == got[1] == got[2]
  assert [(p.problem, p.answer) for p in got[0]] == [
    ("Compute 2 + 3.", "5"),
    ("Compute 7 * 6.", "42"),
  ]
  with pytest.raises(formats.DataFormatError, match=r"data.split: expected one of \['train'\]"):
    formats.load_problem_set(hf_dir, split="test", **kw)


def test_bad_records_name_file_row_and_the_users_column(tmp_path):
  rows = PROBLEMS + [{"prompt": "Compute 1 + 1.", "solution": None, "source": "c"}]
  parquet = write_parquet(
    tmp_path / "bad.parquet", [dict(r, solution=r["solution"] and str(r["solution"])) for r in rows]
  )
  with pytest.raises(DataError) as e:
    formats.load_problem_set(parquet, question_field="prompt", answer_field="solution")
  assert (
    str(e.value)
    == f"{parquet}: row 3: field 'solution': expected a string or integer, got null (None)"
  )
  with pytest.raises(
    DataError, match=r"bad.parquet: row 1: field 'question_text': missing; columns present"
  ):
    formats.load_problem_set(parquet, question_field="question_text")
  # JSONL keeps line numbers (blank lines count), and the mapped column is named
  jsonl = tmp_path / "bad.jsonl"
  jsonl.write_text(
    json.dumps(PROBLEMS[0]) + "\n\n" + json.dumps({"prompt": "", "solution": 1}) + "\n"
  )
  with pytest.raises(DataError, match=r"^.*bad.jsonl:3: field 'prompt': expected non-empty text"):
    formats.load_problem_set(jsonl, question_field="prompt", answer_field="solution")
  with pytest.raises(DataError, match=r"row 2: field 'a': expected an integer, got '4.5'"):
    formats.load_problem_set(
      write_parquet(tmp_path / "f.parquet", [{"q": "x", "a": "1"}, {"q": "y", "a": "4.5"}]),
      question_field="q",
      answer_field="a",
      require_integer_answer=True,
    )


def test_chat_sets_from_parquet_and_datasets_with_a_mapped_column(tmp_path):
  rows = [{"conversation": CHAT, "answer": "5"}]
  parquet = write_parquet(tmp_path / "sft.parquet", rows)
  hf_dir = str(tmp_path / "sft_hf")
  datasets.Dataset.from_list(rows).save_to_disk(hf_dir)
  for src in (parquet, hf_dir):
    (ex,) = formats.load_chat_set(src, messages_field="conversation")
    # struct columns fill absent keys with None; those are dropped, so messages round-trip
    assert [dict(m) for m in ex.messages] == CHAT and ex.extra == {"answer": "5"}
    assert ex.num_tool_calls == 1
  bad = [
    {"conversation": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]}
  ]
  with pytest.raises(DataError) as e:
    formats.load_chat_set(write_parquet(tmp_path / "b.parquet", bad), messages_field="conversation")
  assert "b.parquet: row 1: field 'conversation[0].role': a 'tool' message must follow" in str(
    e.value
  )


def test_config_reads_a_parquet_set_and_a_datasets_dir(tmp_path):
  parquet = write_parquet(
    tmp_path / "train.parquet", [dict(r, solution=str(r["solution"])) for r in PROBLEMS]
  )
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.data.train_path = parquet
  cfg.data.question_field, cfg.data.answer_field = "prompt", "solution"
  run = from_config_dict(cfg, check_paths=True)
  assert [p.answer for p in data_sources.train_problems(run)] == ["5", "42"]
  hf_dir = str(tmp_path / "sft_dir")
  datasets.Dataset.from_list([{"messages": CHAT}]).save_to_disk(hf_dir)
  cfg = rstar2_tiny_cpu.get_config("sft")
  cfg.data.sft_path = hf_dir
  run = from_config_dict(cfg, check_paths=True)  # a directory is an existing source
  assert os.path.isdir(run.data.sft_path) and len(data_sources.sft_examples(run)) == 1


def test_a_missing_mapping_names_the_users_columns_and_the_setting(tmp_path):
  """Issue 43 row 10: a parquet file with columns prompt / solution, one mapping given. Before:
  "field 'answer': missing; keys present: ['problem', 'solution']" (our renamed column)."""
  parquet = write_parquet(tmp_path / "t.parquet", [{"prompt": "Compute 1 + 1.", "solution": "2"}])
  with pytest.raises(DataError) as e:
    formats.load_problem_set(parquet, question_field="prompt")
  assert str(e.value) == (
    f"{parquet}: row 1: field 'answer': missing; columns present: ['prompt', 'solution']; "
    "name the column that holds the answer with --config.data.answer_field=COLUMN"
  )
  with pytest.raises(DataError) as e:
    formats.load_problem_set(parquet)
  assert str(e.value) == (
    f"{parquet}: row 1: field 'problem': missing; columns present: ['prompt', 'solution']; "
    "name the column that holds the problem (or 'question') with "
    "--config.data.question_field=COLUMN"
  )
  with pytest.raises(DataError) as e:
    formats.load_problem_set(parquet, question_field="prompt", answer_field="soluton")
  assert str(e.value) == (
    f"{parquet}: row 1: field 'soluton': missing; columns present: ['prompt', 'solution']; "
    "name the column that holds the answer with --config.data.answer_field=COLUMN"
  )
