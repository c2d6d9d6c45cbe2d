"""Imports the user's own modules named by a config, so the functions they register (rewards,
verifiers, losses) exist before a registry is read: the config's ``imports`` / ``reward.imports``
and the reward registry itself (`rstar_jax.rewards.registry`), hence in the bottom layer.

    import_user_modules("my_rewards, lab.verifiers")   # or ["my_rewards", "lab.verifiers"]

The current directory is put on ``sys.path`` first (a launcher run from a checkout finds a
module next to the recipe, as ``python -m`` would), and a module is imported once per process.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable

from rstar_jax.errors import UserError


class ImportsError(ImportError, UserError):
  """A module named by a config's ``imports`` could not be imported (one line)."""


def module_names(names: str | Iterable[str] | None) -> list[str]:
  """``"a, b.c"`` or ``["a", "b.c"]`` -> ``["a", "b.c"]`` (blanks dropped, order kept)."""
  if names is None:
    return []
  parts = names.split(",") if isinstance(names, str) else list(names)
  out = []
  for p in parts:
    if not isinstance(p, str):
      raise ImportsError(f"imports: expected module names as strings, got {p!r}")
    p = p.strip()
    if p and p not in out:
      out.append(p)
  return out


def import_user_modules(names: str | Iterable[str] | None, *, field: str = "imports") -> list:
  """Imports each module of ``names`` (module docstring); returns the modules.

  Raises:
    ImportsError: naming the config ``field`` and the module, with the import's own reason.
  """
  if os.getcwd() not in sys.path and "" not in sys.path:
    sys.path.insert(0, os.getcwd())
  mods = []
  for name in module_names(names):
    try:
      mods.append(importlib.import_module(name))
    except Exception as e:  # a syntax error in the user's module is as fatal as a missing one
      raise ImportsError(
        f"config.{field}: cannot import module {name!r}: {type(e).__name__}: {e}"
      ) from None
  return mods
