"""Problem and SFT sets from JSONL, parquet or a local Hugging Face `datasets` directory.

    load_problem_set("train.parquet", question_field="prompt", answer_field="solution")
    load_chat_set("sft_dir/", fmt="hf_dataset", messages_field="conversation", split="train")

``fmt`` "auto" picks by the path: a directory is a ``datasets.Dataset.save_to_disk`` folder
(``hf_dataset``), ``.parquet`` / ``.pq`` parquet, anything else JSONL. Nothing is ever
downloaded: a hub name that is not a local path is an error. The field mapping renames the
user's columns to the record layout of `problems` / `sft_data` (whose checks then apply), and
every bad record raises a one-line `DataError` naming the file, the row (the line for JSONL,
the 1-based row for parquet and datasets) and the user's column name.

pyarrow (parquet) and datasets are optional: ``pip install rstar_jax[data]``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rstar_jax.data.jsonl import DataError, iter_jsonl
from rstar_jax.data.problems import Problem, is_integer_text, problem_from_record
from rstar_jax.data.sft_data import ChatExample, example_from_record
from rstar_jax.errors import UserError

FORMATS = ("auto", "jsonl", "parquet", "hf_dataset")
_PARQUET_SUFFIXES = (".parquet", ".pq")


class DataFormatError(ValueError, UserError):
  """The data source itself is unusable (format, missing package, split); one line."""


def resolve_format(path: str | os.PathLike, fmt: str = "auto") -> str:
  """The concrete format of ``path`` ("jsonl" | "parquet" | "hf_dataset")."""
  path = os.fspath(path)
  if fmt not in FORMATS:
    raise DataFormatError(f"data.format: expected one of {list(FORMATS)}, got {fmt!r}")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no such file or directory (nothing is downloaded)")
  if fmt != "auto":
    return fmt
  if os.path.isdir(path):
    return "hf_dataset"
  return "parquet" if path.lower().endswith(_PARQUET_SUFFIXES) else "jsonl"


def _optional(module: str):
  import importlib

  try:
    return importlib.import_module(module)
  except ImportError:
    raise DataFormatError(
      f"reading this data format needs the {module!r} package: pip install rstar_jax[data]"
    ) from None


def _plain(v: Any) -> Any:
  """Columnar values as JSON-like Python: struct fields a row does not have (None) dropped."""
  if isinstance(v, Mapping):
    return {k: _plain(x) for k, x in v.items() if x is not None}
  if isinstance(v, (list, tuple)):
    return [_plain(x) for x in v]
  if hasattr(v, "tolist"):  # numpy arrays / scalars from a datasets row
    return _plain(v.tolist())
  return v


def _iter_parquet(path: str) -> Iterator[tuple[int, dict]]:
  pq = _optional("pyarrow.parquet")
  try:
    pf = pq.ParquetFile(path)
  except Exception as e:  # not a parquet file, truncated footer, ...
    raise DataFormatError(
      f"{path}: not a readable parquet file ({type(e).__name__}: {e})"
    ) from None
  row = 0
  for batch in pf.iter_batches(batch_size=1024):
    for rec in batch.to_pylist():
      row += 1
      yield row, {k: _plain(v) for k, v in rec.items()}


def _iter_hf_dataset(path: str, split: str) -> Iterator[tuple[int, dict]]:
  datasets = _optional("datasets")
  try:
    ds = datasets.load_from_disk(path)
  except Exception as e:
    raise DataFormatError(
      f"{path}: not a `datasets` save_to_disk directory ({type(e).__name__}: {e})"
    ) from None
  if isinstance(ds, datasets.DatasetDict):
    splits = list(ds)
    name = split or (splits[0] if len(splits) == 1 else "train")
    if name not in ds:
      raise DataFormatError(f"{path}: data.split: expected one of {splits}, got {name!r}")
    ds = ds[name]
  elif split:
    raise DataFormatError(f"{path}: data.split={split!r} given but the directory holds one Dataset")
  for i, rec in enumerate(ds, start=1):
    yield i, {k: _plain(v) for k, v in rec.items()}


def iter_records(
  path: str | os.PathLike, fmt: str = "auto", *, split: str = ""
) -> Iterator[tuple[int, dict]]:
  """(row, record) pairs of a data source (JSONL: the line number; others: the 1-based row)."""
  path = os.fspath(path)
  kind = resolve_format(path, fmt)
  if kind == "jsonl":
    return iter_jsonl(path)
  if kind == "parquet":
    return _iter_parquet(path)
  return _iter_hf_dataset(path, split)


def _where(kind: str) -> str:
  return "line" if kind == "jsonl" else "row"


# The config field that maps each of our fields to the user's column.
MAPPING_SETTING = {
  "problem": "data.question_field",
  "answer": "data.answer_field",
  "messages": "data.messages_field",
}


def _missing_column(ours: str, columns: Sequence[str]) -> str:
  """ "missing; columns present: [...]; name the column that holds the answer with
  --config.data.answer_field=COLUMN": the user's own column names and the setting that maps
  one of them to ``ours``."""
  alias = " (or 'question')" if ours == "problem" else ""
  return (
    f"missing; columns present: {sorted(columns)}; name the column that holds the {ours}"
    f"{alias} with --config.{MAPPING_SETTING[ours]}=COLUMN"
  )


def _mapped(
  path: str, row: int, rec: dict, mapping: Mapping[str, str], unit: str
) -> tuple[dict, dict[str, str]]:
  """``rec`` with the user's columns renamed to ours; also ours -> theirs for error messages."""
  columns = list(rec)
  rec = dict(rec)
  back = {}
  for ours, theirs in mapping.items():
    if not theirs or theirs == ours:
      continue
    if theirs not in rec:
      raise DataError(path, row, theirs, _missing_column(ours, columns), unit=unit)
    value = rec.pop(theirs)
    for alias in (ours, "question") if ours == "problem" else (ours,):
      rec.pop(alias, None)  # the mapped column wins over a same-named one
    rec[ours] = value
    back[ours] = theirs
  return rec, back


def _located(
  e: DataError, back: Mapping[str, str], unit: str, columns: Sequence[str] = ()
) -> DataError:
  """``e`` with the source's unit (line / row) and our field name turned back into the
  user's column name (``messages[2].role`` -> ``conversation[2].role``); a missing field of
  ours is named with the user's ``columns`` and the mapping setting to use."""
  field, message = e.field, e.message
  if field is not None:
    head = field.split(".", 1)[0].split("[", 1)[0]
    if head in back:
      field = back[head] + field[len(head) :]
    elif field in MAPPING_SETTING and message.startswith("missing"):
      message = _missing_column(field, columns)
  return DataError(e.path, e.line, field, message, unit=unit)


def load_problem_set(
  path: str | os.PathLike,
  *,
  fmt: str = "auto",
  question_field: str = "",
  answer_field: str = "",
  split: str = "",
  require_integer_answer: bool = False,
) -> list[Problem]:
  """A problem set (`problems.Problem` per record) from any of the formats.

  Args:
    question_field / answer_field: the user's column names ('' = ``problem`` (alias
      ``question``) / ``answer``).
    split: the split of a `DatasetDict` directory.
  Raises:
    DataError: file, row and column of a bad record. DataFormatError: the source itself.
  """
  path = os.fspath(path)
  kind = resolve_format(path, fmt)
  unit = _where(kind)
  mapping = {"problem": question_field, "answer": answer_field}
  out = []
  for row, rec in iter_records(path, kind, split=split):
    columns = list(rec)
    rec, back = _mapped(path, row, rec, mapping, unit)
    try:
      p = problem_from_record(rec, path=path, lineno=row)
    except DataError as e:
      raise _located(e, back, unit, columns) from None
    if require_integer_answer and not is_integer_text(p.answer):
      raise DataError(
        path, row, back.get("answer", "answer"), f"expected an integer, got {p.answer!r}", unit=unit
      )
    out.append(p)
  return out


def load_chat_set(
  path: str | os.PathLike, *, fmt: str = "auto", messages_field: str = "", split: str = ""
) -> list[ChatExample]:
  """An SFT chat set (`sft_data.ChatExample` per record, its rules checked) from any format."""
  path = os.fspath(path)
  kind = resolve_format(path, fmt)
  unit = _where(kind)
  out = []
  for row, rec in iter_records(path, kind, split=split):
    columns = list(rec)
    rec, back = _mapped(path, row, rec, {"messages": messages_field}, unit)
    try:
      out.append(example_from_record(rec, path=path, lineno=row))
    except DataError as e:
      raise _located(e, back, unit, columns) from None
  return out
