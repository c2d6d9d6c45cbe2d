"""Field checks, the section base class and the error type of the typed run configuration.

The vocabulary every config section is written in (`rstar_jax.config.schema`, and
`rstar_jax.learner.optim_config.OptimConfig`, which lives where the learner reads it): it sits at
the bottom of the package's layers (docs/architecture.md), beside `rstar_jax.errors`, so a layer
below `rstar_jax.config` can define its own section. Checks that look names up in a registry
(`rstar_jax.config.checks.registered`) stay in the config layer.

A check knows what it expects ("an int >= 1") and, for numbers and lists, how to normalise a
value a recipe or the command line gives (int -> float, list -> tuple), so a frozen dataclass
can hold exactly one representation. Every problem is reported as one line
``config.<section>.<field>: expected <what>, got <value>``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

from rstar_jax.errors import UserError


class ConfigError(UserError, ValueError):
  """One or more config values are wrong; ``problems`` lists every (dotted path, message).
  A `UserError`: launchers (`rstar_jax.cli.run`) print it as one line, without a traceback."""

  def __init__(self, problems: Sequence[tuple[str, str]]):
    self.problems = list(problems)
    lines = [f"config.{path}: {msg}" for path, msg in self.problems]
    super().__init__(lines[0] if len(lines) == 1 else "invalid config:\n  " + "\n  ".join(lines))


@dataclasses.dataclass(frozen=True)
class Check:
  """``expected`` text, the predicate, and an optional normaliser applied before it."""

  expected: str
  ok: Callable[[Any], bool]
  coerce: Callable[[Any], Any] | None = None


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _to_float(v):
  return float(v) if _is_int(v) else v


def int_range(lo: int | None = None, hi: int | None = None) -> Check:
  bounds = [f">= {lo}" if lo is not None else "", f"<= {hi}" if hi is not None else ""]
  text = " and ".join(b for b in bounds if b)
  return Check(
    "an int" + (" " + text if text else ""),
    lambda v: _is_int(v) and (lo is None or v >= lo) and (hi is None or v <= hi),
  )


def num_range(
  lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False
) -> Check:
  parts = []
  if lo is not None:
    parts.append(f"{'>' if lo_open else '>='} {lo}")
  if hi is not None:
    parts.append(f"{'<' if hi_open else '<='} {hi}")

  def ok(v):
    if not isinstance(v, float) or not math.isfinite(v):
      return False
    if lo is not None and (v <= lo if lo_open else v < lo):
      return False
    return not (hi is not None and (v >= hi if hi_open else v > hi))

  text = "a number " + " and ".join(parts) if parts else "a finite number"
  return Check(text, ok, _to_float)


def one_of(choices: Iterable[Any]) -> Check:
  choices = tuple(choices)
  return Check(f"one of {list(choices)}", lambda v: v in choices)


IS_BOOL = Check("a bool", lambda v: isinstance(v, bool))
IS_STR = Check("a string", lambda v: isinstance(v, str))
STR_TUPLE = Check(
  "a list of strings",
  lambda v: isinstance(v, tuple) and all(isinstance(x, str) for x in v),
  lambda v: tuple(v) if isinstance(v, list) else v,
)


def field(default: Any, check: Check | None, doc: str):
  """A dataclass field with its check and its one-line documentation (``metadata['doc']``)."""
  meta = {"check": check, "doc": doc}
  if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
    return dataclasses.field(default_factory=lambda: default, metadata=meta)
  return dataclasses.field(default=default, metadata=meta)


def run_checks(obj, section: str) -> list[tuple[str, str]]:
  """Normalises and checks every field of ``obj`` that has a check; returns the problems."""
  problems = []
  for f in dataclasses.fields(obj):
    check = f.metadata.get("check")
    if check is None:
      continue
    v = getattr(obj, f.name)
    if check.coerce is not None:
      v = check.coerce(v)
      object.__setattr__(obj, f.name, v)
    if not check.ok(v):
      problems.append((f"{section}.{f.name}", f"expected {check.expected}, got {v!r}"))
  return problems


def did_you_mean(name: str, known: Iterable[str]) -> str:
  close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
  return f"; did you mean {close[0]!r}?" if close else f" (known: {sorted(known)})"


class Section:
  """Base of a config section: runs the field checks, then ``_cross`` (only when every field
  is well-typed); raises `ConfigError` listing every problem. ``SECTION`` is the dotted prefix
  problems are reported under (``optim`` -> ``config.optim.lr: ...``)."""

  SECTION: ClassVar[str] = ""

  def __post_init__(self):
    problems = run_checks(self, self.SECTION)
    if not problems:
      problems = self._cross()
    if problems:
      raise ConfigError(problems)

  def _cross(self) -> list[tuple[str, str]]:
    return []


def section(cls):
  """Makes ``cls`` (a `Section` subclass) a frozen, keyword-only dataclass."""
  return dataclasses.dataclass(frozen=True, kw_only=True)(cls)
