"""Synthetic integer-answer tasks that need the code tool.

Each family is a short templated question ("Compute 48213^517 mod 997.") whose answer a tiny
model cannot produce in its head but gets by writing a few lines of Python and copying the output.
Every problem carries `solution_code`: a reference program in the family's fixed template whose
stdout is the answer (the scripted cold-start solver replays it through the code pool).
Answers here are computed by a *different* route than `solution_code` (sympy or closed forms), so
the test that executes every snippet really cross-checks the two.

Families (difficulty knobs in brackets, see `Difficulty`):
  mul            A * B                                   [operand_digits]
  mulmod         (A * B) mod M                           [operand_digits, modulus_digits]
  powmod         A^E mod M                               [operand_digits, exponent_digits, modulus_digits]
  count_primes   primes in [L, R]                        [range_max]
  divisor_sum    sum of the divisors of N                [range_max]
  digit_sum_pow  digit sum of A^E, A two digits          [exponent_digits]
  ncr_mod        C(n, k) mod M                           [n_max, modulus_digits]
  power_sum      (1^p + ... + N^p) mod M, p in 2..5      [n_max, modulus_digits]
  fib_mod        F(N) mod M                              [index_max, modulus_digits]
  add            A + B                                   [operand_digits]
  mul_last_digit last digit of A * B                     [operand_digits]

`add` and `mul_last_digit` can be answered "in the head" (a model can learn a sum table or the
last-digit rule of a product) but less reliably than by running the code, so a policy can
stop calling the tool and still often be right: the tasks where ASTER's interaction collapse is
a real option (issue 30's sparse/dense cold-start claim). They are not in `DEFAULT_FAMILIES`
(what `families=None` means), so existing configs draw the same problems as before.

`make_splits` returns disjoint train / held-out lists (disjoint by text and by (family, params)).
The held-out list depends only on (seed, n_eval, families, difficulty), so growing n_train never
changes the evaluation set.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable, Sequence

import sympy

from rstar_jax.data.problems import Problem, write_jsonl  # noqa: F401  (re-exported)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Difficulty:
  """Size knobs of the generated numbers (all inclusive upper limits).

  Attributes:
      operand_digits: digits of A and B in mul / mulmod and of the base in powmod.
      modulus_digits: digits of the modulus M (mulmod, powmod, ncr_mod, power_sum, fib_mod).
      exponent_digits: digits of the exponent (powmod; digit_sum_pow clamps at 3 because Python
          refuses to print ints over 4300 digits).
      range_max: upper end R of count_primes and largest N of divisor_sum (<= 200000 keeps the
          reference trial-division code under a second).
      n_max: largest n of ncr_mod and N of power_sum.
      index_max: largest Fibonacci index of fib_mod.
  """

  operand_digits: int = 5
  modulus_digits: int = 3
  exponent_digits: int = 3
  range_max: int = 10_000
  n_max: int = 200
  index_max: int = 5_000

  def __post_init__(self):
    limits = {
      "operand_digits": (1, 30),
      "modulus_digits": (2, 18),
      "exponent_digits": (1, 6),
      "range_max": (100, 200_000),
      "n_max": (10, 5_000),
      "index_max": (10, 200_000),
    }
    for name, (lo, hi) in limits.items():
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"Difficulty.{name}: expected an int in [{lo}, {hi}], got {v!r}")


DIFFICULTY_PRESETS = {
  "easy": Difficulty(
    operand_digits=3, modulus_digits=2, exponent_digits=2, range_max=1_000, n_max=40, index_max=500
  ),
  "medium": Difficulty(),
  "hard": Difficulty(
    operand_digits=8,
    modulus_digits=4,
    exponent_digits=4,
    range_max=100_000,
    n_max=1_000,
    index_max=50_000,
  ),
}


def _ndigits(rng: random.Random, d: int) -> int:
  return rng.randrange(10 ** (d - 1) if d > 1 else 1, 10**d)


def _modulus(rng: random.Random, d: Difficulty) -> int:
  return rng.randrange(max(10 ** (d.modulus_digits - 1), 2), 10**d.modulus_digits)


# Each family: draw(rng, difficulty) -> params; text(params); code(params); answer(params).
# Answers use a route independent of the code template (see module docstring).


def _mul(rng, d):
  return {"a": _ndigits(rng, d.operand_digits), "b": _ndigits(rng, d.operand_digits)}


def _mulmod(rng, d):
  return {**_mul(rng, d), "m": _modulus(rng, d)}


def _powmod(rng, d):
  return {
    "a": _ndigits(rng, d.operand_digits),
    "e": _ndigits(rng, d.exponent_digits),
    "m": _modulus(rng, d),
  }


def _count_primes(rng, d):
  r = rng.randrange(max(d.range_max // 10, 20), d.range_max + 1)
  return {"lo": rng.randrange(1, r // 2), "hi": r}


def _divisor_sum(rng, d):
  return {"n": rng.randrange(max(d.range_max // 10, 12), d.range_max + 1)}


def _digit_sum_pow(rng, d):
  return {"a": rng.randrange(11, 100), "e": _ndigits(rng, min(d.exponent_digits, 3))}


def _ncr_mod(rng, d):
  n = rng.randrange(max(d.n_max // 2, 6), d.n_max + 1)
  return {"n": n, "k": rng.randrange(2, n - 1), "m": _modulus(rng, d)}


def _power_sum(rng, d):
  return {
    "n": rng.randrange(max(d.n_max // 2, 5), d.n_max + 1),
    "p": rng.randrange(2, 6),
    "m": _modulus(rng, d),
  }


def _fib_mod(rng, d):
  return {"n": rng.randrange(max(d.index_max // 10, 10), d.index_max + 1), "m": _modulus(rng, d)}


def _last_digit(x: int) -> int:
  return int(str(x)[-1])


def _digit_sum(x: int) -> int:
  s = 0
  while x:
    x, r = divmod(x, 10)
    s += r
  return s


def _faulhaber(n: int, p: int) -> int:
  k = sympy.Symbol("k")
  return int(sympy.summation(k**p, (k, 1, n)))


@dataclasses.dataclass(frozen=True)
class Family:
  name: str
  draw: Callable[[random.Random, Difficulty], dict]
  text: Callable[[dict], str]
  code: Callable[[dict], str]
  answer: Callable[[dict], int]


FAMILIES: dict[str, Family] = {
  f.name: f
  for f in (
    Family(
      "mul",
      _mul,
      lambda p: f"Compute {p['a']} * {p['b']}.",
      lambda p: f"print({p['a']} * {p['b']})",
      lambda p: int(sympy.Integer(p["a"]) * p["b"]),
    ),
    Family(
      "mulmod",
      _mulmod,
      lambda p: f"Compute ({p['a']} * {p['b']}) mod {p['m']}.",
      lambda p: f"print({p['a']} * {p['b']} % {p['m']})",
      lambda p: int(sympy.Mod(sympy.Integer(p["a"]) * p["b"], p["m"])),
    ),
    Family(
      "powmod",
      _powmod,
      lambda p: f"Compute {p['a']}^{p['e']} mod {p['m']}.",
      lambda p: f"print(pow({p['a']}, {p['e']}, {p['m']}))",
      lambda p: int(sympy.Integer(p["a"]) ** p["e"] % p["m"]),
    ),
    Family(
      "count_primes",
      _count_primes,
      lambda p: f"How many primes are there between {p['lo']} and {p['hi']}, inclusive?",
      lambda p: (
        f"count = 0\n"
        f"for n in range({max(p['lo'], 2)}, {p['hi']} + 1):\n"
        f"    if all(n % d for d in range(2, int(n ** 0.5) + 1)):\n"
        f"        count += 1\n"
        f"print(count)"
      ),
      lambda p: int(sympy.primepi(p["hi"]) - sympy.primepi(p["lo"] - 1)),
    ),
    Family(
      "divisor_sum",
      _divisor_sum,
      lambda p: f"Find the sum of all positive divisors of {p['n']}.",
      lambda p: f"n = {p['n']}\nprint(sum(d for d in range(1, n + 1) if n % d == 0))",
      lambda p: int(sympy.divisor_sigma(p["n"])),
    ),
    Family(
      "digit_sum_pow",
      _digit_sum_pow,
      lambda p: f"Find the sum of the digits of {p['a']}^{p['e']}.",
      lambda p: f"print(sum(int(c) for c in str({p['a']} ** {p['e']})))",
      lambda p: _digit_sum(p["a"] ** p["e"]),
    ),
    Family(
      "ncr_mod",
      _ncr_mod,
      lambda p: f"Compute C({p['n']}, {p['k']}) mod {p['m']}, where C is the binomial coefficient.",
      lambda p: f"import math\nprint(math.comb({p['n']}, {p['k']}) % {p['m']})",
      lambda p: int(sympy.binomial(p["n"], p["k"]) % p["m"]),
    ),
    Family(
      "power_sum",
      _power_sum,
      lambda p: f"Compute (1^{p['p']} + 2^{p['p']} + ... + {p['n']}^{p['p']}) mod {p['m']}.",
      lambda p: f"print(sum(k ** {p['p']} for k in range(1, {p['n']} + 1)) % {p['m']})",
      lambda p: _faulhaber(p["n"], p["p"]) % p["m"],
    ),
    Family(
      "fib_mod",
      _fib_mod,
      lambda p: (
        f"Compute F({p['n']}) mod {p['m']}, where F(1) = F(2) = 1 and F(n) = F(n-1) + F(n-2)."
      ),
      lambda p: (
        f"a, b = 1, 1\nfor _ in range({p['n']} - 2):\n    a, b = b, (a + b) % {p['m']}\nprint(b)"
      ),
      lambda p: int(sympy.fibonacci(p["n"]) % p["m"]),
    ),
    Family(
      "add",
      _mul,
      lambda p: f"Compute {p['a']} + {p['b']}.",
      lambda p: f"print({p['a']} + {p['b']})",
      lambda p: int(sympy.Integer(p["a"]) + p["b"]),
    ),
    Family(
      "mul_last_digit",
      _mul,
      lambda p: f"What is the last digit of {p['a']} * {p['b']}?",
      lambda p: f"print({p['a']} * {p['b']} % 10)",
      lambda p: _last_digit(int(sympy.Integer(p["a"]) * p["b"])),
    ),
  )
}


# `families=None`: the tool-needing families (the ones before `add`).
DEFAULT_FAMILIES: tuple[str, ...] = tuple(f for f in FAMILIES if f not in ("add", "mul_last_digit"))


def make_problem(family: str, params: dict) -> Problem:
  """Builds the Problem for given parameters (text, answer and reference code)."""
  if family not in FAMILIES:
    raise ValueError(f"family: expected one of {sorted(FAMILIES)}, got {family!r}")
  f = FAMILIES[family]
  return Problem(
    problem=f.text(params),
    answer=str(f.answer(params)),
    family=family,
    params=dict(params),
    solution_code=f.code(params),
  )


def _resolve(
  families: Sequence[str] | None, difficulty: Difficulty | str | None
) -> tuple[tuple[str, ...], Difficulty]:
  fams = DEFAULT_FAMILIES if families is None else tuple(families)
  if not fams:
    raise ValueError("families: expected at least one family name, got none")
  unknown = [f for f in fams if f not in FAMILIES]
  if unknown:
    raise ValueError(f"families: unknown {unknown}; expected names from {sorted(FAMILIES)}")
  if len(set(fams)) != len(fams):
    raise ValueError(f"families: expected distinct names, got {list(fams)}")
  if difficulty is None:
    difficulty = Difficulty()
  elif isinstance(difficulty, str):
    if difficulty not in DIFFICULTY_PRESETS:
      raise ValueError(
        f"difficulty: expected a Difficulty or one of {sorted(DIFFICULTY_PRESETS)}, got {difficulty!r}"
      )
    difficulty = DIFFICULTY_PRESETS[difficulty]
  elif not isinstance(difficulty, Difficulty):
    raise TypeError(
      f"difficulty: expected a Difficulty or preset name, got {type(difficulty).__name__}"
    )
  return fams, difficulty


def generate(
  seed: int,
  n: int,
  *,
  families: Sequence[str] | None = None,
  difficulty: Difficulty | str | None = None,
  exclude: Iterable[Problem] = (),
  max_tries_per_problem: int = 200,
  _stream: int = 0,
) -> list[Problem]:
  """`n` distinct problems, families taken round-robin, none equal (by text or params) to `exclude`.

  Deterministic in (seed, n, families, difficulty, exclude); a prefix of a longer run with the
  same arguments.

  Raises:
      ValueError: when a family's parameter space is too small for the requested count.
  """
  if n < 0:
    raise ValueError(f"n: expected >= 0, got {n}")
  fams, diff = _resolve(families, difficulty)
  # String seeds are hashed with SHA-512 by `random`, stable across processes and platforms.
  rng = random.Random(f"rstar_jax.synthetic:{seed}:{_stream}")
  seen_keys = set()
  seen_text = set()
  for p in exclude:
    seen_keys.add(p.key)
    seen_text.add(p.problem)
  out = []
  for i in range(n):
    fam = FAMILIES[fams[i % len(fams)]]
    for _ in range(max_tries_per_problem):
      params = fam.draw(rng, diff)
      prob = Problem(problem=fam.text(params), answer="?", family=fam.name, params=params)
      if prob.key not in seen_keys and prob.problem not in seen_text:
        break
    else:
      raise ValueError(
        f"family {fam.name!r}: could not find a new problem after {max_tries_per_problem} draws "
        f"(problem {i} of {n}); raise the difficulty ranges or ask for fewer problems"
      )
    seen_keys.add(prob.key)
    seen_text.add(prob.problem)
    out.append(make_problem(fam.name, params))
  return out


def make_splits(
  seed: int,
  n_train: int,
  n_eval: int,
  *,
  families: Sequence[str] | None = None,
  difficulty: Difficulty | str | None = None,
) -> tuple[list[Problem], list[Problem]]:
  """Disjoint (train, eval) problem lists.

  The eval list is drawn first from its own stream, so it depends only on (seed, n_eval,
  families, difficulty); train is drawn from another stream excluding every eval problem by
  text and by (family, params).
  """
  eval_set = generate(seed, n_eval, families=families, difficulty=difficulty, _stream=1)
  train = generate(
    seed, n_train, families=families, difficulty=difficulty, exclude=eval_set, _stream=0
  )
  return train, eval_set
