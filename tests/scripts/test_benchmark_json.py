"""Issue 43 row 6: ``claims.py --smoke --json > out`` put progress lines on stdout, so
``json.load`` failed. Every benchmark's ``--json`` now prints exactly one JSON document on
stdout (progress, tables, child processes on stderr) through ``benchmarks/json_stdout.py``:
checked structurally for every script, by behaviour for the helper (Python prints, a child
process, a raw fd write) and end to end for one cheap benchmark."""

import ast
import glob
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(
  p
  for p in glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))
  if os.path.basename(p) != "json_stdout.py"
)


def _calls(tree):
  return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def _name(func) -> str:
  if isinstance(func, ast.Attribute):
    return f"{_name(func.value)}.{func.attr}"
  return func.id if isinstance(func, ast.Name) else ""


@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_every_benchmark_has_json_through_the_reserved_stdout(path):
  tree = ast.parse(open(path, encoding="utf-8").read())
  calls = _calls(tree)
  flags = [
    c
    for c in calls
    if _name(c.func).endswith("add_argument")
    and c.args
    and isinstance(c.args[0], ast.Constant)
    and c.args[0].value == "--json"
  ]
  assert flags, f"{path}: no --json flag"
  assert any(_name(c.func) == "json_stdout.reserve" for c in calls), path
  # The JSON goes out through emit only: no print(json.dumps(...)) left to interleave.
  printed = [
    c.lineno
    for c in calls
    if _name(c.func) == "print"
    and any(isinstance(a, ast.Call) and _name(a.func) == "json.dumps" for a in c.args)
  ]
  assert not printed, f"{path}: print(json.dumps(...)) at lines {printed}"


def test_reserved_stdout_holds_only_the_json():
  code = (
    "import os, subprocess, sys\n"
    f"sys.path.insert(0, {os.path.join(ROOT, 'benchmarks')!r})\n"
    "import json_stdout\n"
    "emit = json_stdout.reserve(True)\n"
    "print('[bench] progress line')\n"
    "subprocess.run([sys.executable, '-c', 'print(\"child output\")'], check=True)\n"
    "os.write(1, b'native write\\n')\n"
    "emit({'a': 1, 'b': [2, 3]}, indent=1)\n"
    "print('after')\n"
  )
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
  assert p.returncode == 0, p.stderr
  assert json.loads(p.stdout) == {"a": 1, "b": [2, 3]}
  for line in ("[bench] progress line", "child output", "native write", "after"):
    assert line in p.stderr


def test_a_benchmark_json_loads_from_its_stdout():
  p = subprocess.run(
    [sys.executable, os.path.join(ROOT, "benchmarks", "rollout_pipeline.py")]
    + ["--trajectories", "4", "--slots", "4", "--repeats", "1", "--json"],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=ROOT,
  )
  assert p.returncode == 0, p.stderr[-3000:]
  out = json.loads(p.stdout)  # the whole of stdout is one document
  assert [r["loop"] for r in out["rows"]] == ["per-turn barrier", "async agent loop"]
  assert "vs barrier" in p.stderr  # the table went to stderr
