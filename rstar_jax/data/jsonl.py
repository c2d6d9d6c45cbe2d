"""JSONL reading and writing with errors that point at the offending file, line and field."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

from rstar_jax.errors import UserError


class DataError(ValueError, UserError):
  """A data file is malformed. The message names the file, the 1-based line (``unit="row"``:
  the row of a parquet file or datasets directory) and the field."""

  def __init__(
    self,
    path: str | os.PathLike,
    line: int,
    field: str | None,
    message: str,
    *,
    unit: str = "line",
  ):
    self.path = os.fspath(path)
    self.line = line
    self.field = field
    self.message = message
    self.unit = unit
    where = f"{self.path}:{line}" if unit == "line" else f"{self.path}: {unit} {line}"
    if field is not None:
      where += f": field '{field}'"
    super().__init__(f"{where}: {message}")


def type_name(value: Any) -> str:
  return "null" if value is None else type(value).__name__


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
  """Yields (line_number, object) for each non-blank line; every line must be a JSON object."""
  with open(path, encoding="utf-8") as f:
    for lineno, raw in enumerate(f, start=1):
      if not raw.strip():
        continue
      try:
        obj = json.loads(raw)
      except json.JSONDecodeError as e:
        raise DataError(path, lineno, None, f"invalid JSON ({e.msg} at column {e.colno})") from None
      if not isinstance(obj, dict):
        raise DataError(path, lineno, None, f"expected a JSON object, got {type_name(obj)}")
      yield lineno, obj


def write_jsonl_records(path: str | os.PathLike, records: Iterable[dict]) -> int:
  """Writes one JSON object per line (UTF-8, non-ASCII kept) atomically; returns the count."""
  path = os.fspath(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp.{os.getpid()}"
  n = 0
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      for rec in records:
        f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        n += 1
  except BaseException:
    os.unlink(tmp)
    raise
  # Rename last so a crash never leaves a half-written set under the final name.
  os.replace(tmp, path)
  return n
