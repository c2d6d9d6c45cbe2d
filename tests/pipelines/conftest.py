"""Shared by the pipeline tests: the metrics.jsonl schema of docs/metrics.md as a checker."""

import os
import re

import pytest

METRICS_DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "metrics.md")


def documented_names(path: str = METRICS_DOC) -> list[str]:
  """Every backticked name in the first cell of a row of the tables headed ``| key |`` in
  docs/metrics.md (other tables, e.g. the list of files, are not key tables)."""
  out, in_keys = [], False
  with open(path, encoding="utf-8") as f:
    for line in f:
      if not line.startswith("|"):
        in_keys = False
        continue
      cell = line.split("|")[1].strip()
      if set(line.strip()) <= set("|-: "):
        continue
      if not cell.startswith("`"):  # a header row
        in_keys = cell == "key"
        continue
      if in_keys:
        out += re.findall(r"`([^`]+)`", cell)
  return out


def undocumented(keys) -> list[str]:
  """The keys of ``keys`` that no key row of docs/metrics.md names, sorted; a ``<placeholder>``
  in a documented name stands for one name part (letters, digits, ``_``, ``.``, ``-``)."""
  pats = [
    re.compile("[A-Za-z0-9_.-]+".join(re.escape(p) for p in re.split(r"<[^>]+>", n)) + r"\Z")
    for n in documented_names()
  ]
  return sorted(k for k in set(keys) if not any(p.match(k) for p in pats))


@pytest.fixture
def metrics_doc_names():
  return documented_names()


@pytest.fixture
def metrics_doc_check():
  """``check(records)``: asserts every key of the metric records is documented; returns the keys."""

  def check(records):
    keys = {k for r in records for k in r}
    missing = undocumented(keys)
    assert not missing, f"metrics.jsonl keys missing from docs/metrics.md: {missing}"
    return keys

  return check
