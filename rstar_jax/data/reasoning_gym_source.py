"""Optional problem source: reasoning-gym's procedural integer-answer tasks.

`pip install reasoning-gym==0.1.25` (imported lazily; the rest of rstar_jax does not need it).
Its module `__version__` string says 0.1.19 even in 0.1.25, so the pin is checked against the
installed distribution's metadata.

Only tasks whose answers are integers are exposed (docs/reference.md §6.2): basic_arithmetic (operators
restricted to + - * by default, so no fractions appear), products, gcd, lcm, count_primes.
Each Problem gets a `solution_code` built from the task's metadata, in the same print-the-answer
style as `synthetic_tasks`, and `family = "rg/<task>"`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable
from typing import Any

from rstar_jax.data.problems import Problem, is_integer_text

REASONING_GYM_VERSION = "0.1.25"


def _import_rg():
  try:
    rg = importlib.import_module("reasoning_gym")
  except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
      f"reasoning-gym is optional; install it with `pip install reasoning-gym=={REASONING_GYM_VERSION}`"
    ) from e
  installed = importlib.metadata.version("reasoning-gym")
  if installed != REASONING_GYM_VERSION:
    raise ImportError(
      f"reasoning-gym: expected version {REASONING_GYM_VERSION} (generators differ between "
      f"versions, so seeds would not reproduce), got {installed}"
    )
  return rg


def _expr_code(md: dict) -> str:
  return f"print({md['expression']})"


def _numbers_code(fn: str) -> Callable[[dict], str]:
  return lambda md: f"import math\nprint(math.{fn}({', '.join(str(x) for x in md['numbers'])}))"


def _count_primes_code(md: dict) -> str:
  return (
    f"count = 0\n"
    f"for n in range({max(md['start'], 2)}, {md['end']} + 1):\n"
    f"    if all(n % d for d in range(2, int(n ** 0.5) + 1)):\n"
    f"        count += 1\n"
    f"print(count)"
  )


# task -> (default config overrides, metadata keys kept as params, code builder)
TASKS: dict[str, tuple[dict[str, Any], tuple[str, ...], Callable[[dict], str]]] = {
  "basic_arithmetic": ({"operators": ("+", "-", "*")}, ("expression",), _expr_code),
  "products": ({}, ("expression",), _expr_code),
  "gcd": ({}, ("numbers",), _numbers_code("gcd")),
  "lcm": ({}, ("numbers",), _numbers_code("lcm")),
  "count_primes": ({}, ("start", "end"), _count_primes_code),
}


def create_dataset(task: str, n: int, seed: int, **config):
  """The reasoning-gym dataset object (has `score_answer`) for a supported task."""
  if task not in TASKS:
    raise ValueError(f"task: expected one of {sorted(TASKS)} (integer-answer tasks), got {task!r}")
  rg = _import_rg()
  defaults, _, _ = TASKS[task]
  return rg.create_dataset(task, size=n, seed=seed, **{**defaults, **config})


def entry_to_problem(task: str, entry: dict) -> Problem:
  _, keys, code = TASKS[task]
  md = entry["metadata"]
  answer = str(entry["answer"]).strip()
  if not is_integer_text(answer):
    raise ValueError(
      f"reasoning-gym {task}: expected an integer answer, got {answer!r} for {entry['question']!r}"
    )
  params = {k: list(md[k]) if isinstance(md[k], tuple) else md[k] for k in keys}
  return Problem(
    problem=entry["question"],
    answer=answer,
    family=f"rg/{task}",
    params=params,
    solution_code=code(md),
  )


def reasoning_gym_problems(task: str, n: int, seed: int, **config) -> list[Problem]:
  """`n` problems of a reasoning-gym task, deterministic in (task, n, seed, config).

  Args:
      task: one of `TASKS`.
      config: overrides of the task's reasoning-gym config (e.g. `max_digits=6`).
  """
  ds = create_dataset(task, n, seed, **config)
  return [entry_to_problem(task, ds[i]) for i in range(n)]


def reasoning_gym_splits(
  task: str, n_train: int, n_eval: int, seed: int, **config
) -> tuple[list[Problem], list[Problem]]:
  """Disjoint (train, eval) lists: eval from stream (seed, 1), train from stream (seed, 0) with
  duplicates of eval (by text or params) and repeats within train dropped.

  Raises:
      ValueError: when the task's config space cannot supply `n_train` new problems.
  """
  eval_set, seen_text, seen_key = [], set(), set()
  for p in reasoning_gym_problems(task, n_eval, seed=2 * seed + 1, **config):
    if p.problem not in seen_text and p.key not in seen_key:
      eval_set.append(p)
      seen_text.add(p.problem)
      seen_key.add(p.key)
  # Over-draw so that dropped duplicates rarely leave train short; the prefix is deterministic.
  pool = reasoning_gym_problems(task, 2 * n_train + 16, seed=2 * seed, **config)
  train = []
  for p in pool:
    if len(train) == n_train:
      break
    if p.problem not in seen_text and p.key not in seen_key:
      train.append(p)
      seen_text.add(p.problem)
      seen_key.add(p.key)
  if len(train) < n_train:
    raise ValueError(
      f"reasoning-gym {task}: only {len(train)} distinct train problems (asked {n_train}) "
      f"outside the eval set; widen the task config"
    )
  return train, eval_set


def scorer_disagreements(
  task: str,
  n: int,
  seed: int,
  score_fn: Callable[[str, str], float],
  candidates: Callable[[str], list[str]] | None = None,
  **config,
) -> list[dict]:
  """Cross-checks `score_fn(response_text, gold)` against reasoning-gym's `score_answer`.

  For each entry and each candidate answer string c (default: the gold, gold ± 1, 10 * gold,
  -gold), reasoning-gym's verdict is `score_answer(c, entry) == 1.0` and ours is
  `score_fn("<answer>\\boxed{c}</answer>", gold) == 1.0`. Returns the cases where they differ
  (an empty list means the scorers agree).
  """

  def default_candidates(gold: str) -> list[str]:
    g = int(gold)
    return sorted(
      {str(g), str(g + 1), str(g - 1), str(10 * g), str(-g)}, key=lambda s: (s != gold, s)
    )

  candidates = candidates or default_candidates
  ds = create_dataset(task, n, seed, **config)
  out = []
  for i in range(n):
    entry = ds[i]
    gold = str(entry["answer"])
    for c in candidates(gold):
      theirs = ds.score_answer(answer=c, entry=entry) == 1.0
      ours = float(score_fn(f"<answer>\\boxed{{{c}}}</answer>", gold)) == 1.0
      if theirs != ours:
        out.append(
          {
            "task": task,
            "index": i,
            "gold": gold,
            "candidate": c,
            "reasoning_gym": theirs,
            "ours": ours,
          }
        )
  return out


__all__ = [
  "REASONING_GYM_VERSION",
  "TASKS",
  "create_dataset",
  "entry_to_problem",
  "reasoning_gym_problems",
  "reasoning_gym_splits",
  "scorer_disagreements",
]
