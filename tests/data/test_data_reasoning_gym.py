"""reasoning-gym source (optional dependency): integer tasks, runnable reference code, scorer cross-check."""

import json
import re
import subprocess
import sys

import pytest

pytest.importorskip("reasoning_gym")

from rstar_jax.data import reasoning_gym_source as rgs  # noqa: E402

_RUNNER = r"""
import contextlib, io, json, sys
outs = []
for code in json.load(sys.stdin):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, "<solution>", "exec"), {"__name__": "__main__"})
    outs.append(buf.getvalue().strip())
json.dump(outs, sys.stdout)
"""


@pytest.mark.parametrize("task", sorted(rgs.TASKS))
def test_problems_deterministic_integer_and_code_prints_answer(task):
  probs = rgs.reasoning_gym_problems(task, 12, seed=4)
  assert probs == rgs.reasoning_gym_problems(task, 12, seed=4)
  assert probs != rgs.reasoning_gym_problems(task, 12, seed=5)
  assert all(p.family == f"rg/{task}" and p.answer.lstrip("-").isdigit() for p in probs)
  r = subprocess.run(
    [sys.executable, "-I", "-c", _RUNNER],
    input=json.dumps([p.solution_code for p in probs]),
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert r.returncode == 0, r.stderr
  assert json.loads(r.stdout) == [p.answer for p in probs]


def test_unsupported_task_is_named():
  with pytest.raises(ValueError, match="prime_factorization"):
    rgs.reasoning_gym_problems("prime_factorization", 1, seed=0)


def _exact_integer_score(response, gold):
  m = re.findall(r"\\boxed\{([^}]*)\}", response)
  return float(bool(m) and m[-1].strip() == gold.strip())


def test_cross_check_harness_finds_disagreements():
  # An exact-string scorer agrees with reasoning-gym's exact-match scorer everywhere ...
  assert rgs.scorer_disagreements("gcd", 10, 0, _exact_integer_score) == []
  # ... and a scorer that accepts everything is caught.
  bad = rgs.scorer_disagreements("gcd", 10, 0, lambda r, g: 1.0)
  assert bad and all(d["ours"] and not d["reasoning_gym"] for d in bad)


@pytest.mark.parametrize("task", sorted(rgs.TASKS))
def test_our_math_reward_agrees_with_reasoning_gym(task):
  """rstar_jax.rewards.math_reward.score vs reasoning-gym's scorer on clean integer answers.

  Skips until the rewards module exists (it is written separately).
  """
  math_reward = pytest.importorskip("rstar_jax.rewards.math_reward")
  assert rgs.scorer_disagreements(task, 15, 1, math_reward.score) == []


def test_splits_disjoint():
  train, evals = rgs.reasoning_gym_splits("lcm", 150, 50, seed=0)
  assert len(train) == 150 and 0 < len(evals) <= 50
  assert not {p.problem for p in train} & {p.problem for p in evals}
  assert not {p.key for p in train} & {p.key for p in evals}
  assert len({p.problem for p in train}) == 150
  with pytest.raises(ValueError, match="distinct train problems"):
    rgs.reasoning_gym_splits("gcd", 200, 10, seed=0, max_value=9)
