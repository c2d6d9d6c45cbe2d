"""Synthetic tool-needing tasks: determinism, disjoint splits, answers checked by running the code."""

import collections
import concurrent.futures
import json
import os
import subprocess
import sys

import pytest

from rstar_jax.data import synthetic_tasks as st
from rstar_jax.data.problems import load_problems

# Runs each snippet the way the code tool does (a fresh program, stdout = answer), but many per
# interpreter so hundreds of problems fit the test budget.
_BATCH_RUNNER = r"""
import contextlib, io, json, sys
outs = []
for code in json.load(sys.stdin):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, "<solution>", "exec"), {"__name__": "__main__"})
    outs.append(buf.getvalue())
json.dump(outs, sys.stdout)
"""


def _run_isolated(code, timeout=20):
  r = subprocess.run(
    [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=timeout
  )
  assert r.returncode == 0, r.stderr
  return r.stdout


def _run_batch(codes, timeout=60):
  r = subprocess.run(
    [sys.executable, "-I", "-c", _BATCH_RUNNER],
    input=json.dumps(codes),
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert r.returncode == 0, r.stderr
  return json.loads(r.stdout)


def test_every_family_answer_matches_its_code_standalone():
  """Each family at each preset: the snippet as its own `python -I` program prints the answer."""
  probs = []
  for preset in ("easy", "medium", "hard"):
    probs += st.generate(7, 2 * len(st.FAMILIES), families=list(st.FAMILIES), difficulty=preset)
  assert {p.family for p in probs} == set(st.FAMILIES)
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    outs = list(pool.map(lambda p: _run_isolated(p.solution_code), probs))
  for p, out in zip(probs, outs):
    assert out.strip() == p.answer, (p.problem, p.solution_code, out)


def test_split_answers_match_executed_code():
  train, evals = st.make_splits(1, 270, 90)
  probs = train + evals
  outs = _run_batch([p.solution_code for p in probs])
  bad = [(p.problem, p.answer, o.strip()) for p, o in zip(probs, outs) if o.strip() != p.answer]
  assert not bad, bad[:5]


def test_deterministic_and_seed_dependent():
  a = st.make_splits(5, 60, 20, difficulty="easy")
  assert a == st.make_splits(5, 60, 20, difficulty="easy")
  assert a != st.make_splits(6, 60, 20, difficulty="easy")


def test_deterministic_across_processes(tmp_path):
  """No dependence on hash randomisation: another interpreter with another PYTHONHASHSEED agrees."""
  out = tmp_path / "eval.jsonl"
  code = (
    "import sys; from rstar_jax.data import synthetic_tasks as st; "
    "tr, ev = st.make_splits(9, 30, 18); st.write_jsonl(sys.argv[1], ev)"
  )
  env = {**os.environ, "PYTHONHASHSEED": "12345"}
  subprocess.run([sys.executable, "-c", code, str(out)], check=True, env=env, timeout=60)
  assert load_problems(out) == st.make_splits(9, 30, 18)[1]


def test_splits_disjoint_by_text_and_params():
  train, evals = st.make_splits(0, 900, 300)
  assert len(train) == 900 and len(evals) == 300
  assert not {p.problem for p in train} & {p.problem for p in evals}
  assert not {p.key for p in train} & {p.key for p in evals}
  assert len({p.key for p in train}) == 900 and len({p.problem for p in train}) == 900


def test_disjoint_under_collision_pressure():
  """A 1-digit `mul` space has only 81 problems; 60 + 21 must use every one exactly once."""
  tiny = st.Difficulty(operand_digits=1)
  train, evals = st.make_splits(2, 60, 21, families=["mul"], difficulty=tiny)
  keys = [p.key for p in train + evals]
  assert len(set(keys)) == 81
  with pytest.raises(ValueError, match="family 'mul'"):
    st.make_splits(2, 61, 21, families=["mul"], difficulty=tiny)


def test_eval_set_independent_of_train_size_and_train_is_prefix():
  tr1, ev1 = st.make_splits(3, 40, 27)
  tr2, ev2 = st.make_splits(3, 80, 27)
  assert ev1 == ev2
  assert tr2[:40] == tr1


def test_families_round_robin_and_difficulty_knobs():
  probs = st.generate(
    0,
    90,
    families=["mul", "powmod", "count_primes"],
    difficulty=st.Difficulty(operand_digits=7, range_max=500),
  )
  assert collections.Counter(p.family for p in probs) == {
    "mul": 30,
    "powmod": 30,
    "count_primes": 30,
  }
  for p in probs:
    if p.family == "mul":
      assert len(str(p.params["a"])) == 7 == len(str(p.params["b"]))
    if p.family == "count_primes":
      assert 1 <= p.params["lo"] < p.params["hi"] <= 500
    assert p.answer.lstrip("-").isdigit()


def test_default_families_leave_out_the_mental_ones():
  """`families=None` keeps drawing the nine tool-needing families (existing splits unchanged);
  the in-the-head families (issue 30) only when named, with answers a model can guess."""
  assert set(st.DEFAULT_FAMILIES) == set(st.FAMILIES) - {"add", "mul_last_digit"}
  assert {p.family for p in st.generate(0, 27)} == set(st.DEFAULT_FAMILIES)
  probs = st.generate(0, 40, families=["add", "mul_last_digit"], difficulty="easy")
  for p in probs:
    a, b = p.params["a"], p.params["b"]
    assert p.answer == str(a + b if p.family == "add" else (a * b) % 10)


def test_bad_arguments_are_named():
  with pytest.raises(ValueError, match="Difficulty.range_max"):
    st.Difficulty(range_max=10**9)
  with pytest.raises(ValueError, match="unknown \\['nope'\\]"):
    st.make_splits(0, 1, 1, families=["mul", "nope"])
  with pytest.raises(ValueError, match="difficulty"):
    st.make_splits(0, 1, 1, difficulty="extreme")
