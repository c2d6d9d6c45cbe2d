"""Launcher edge: user errors as one line, bugs as tracebacks, paths checked before any work.

    from rstar_jax import cli
    def main(argv):
        cli.check_workdir(_WORKDIR.value)
        run = cli.typed_config(_CONFIG.value, "rl", "launchers.train")
        cli.check_dir(run.model.hf_dir, "config.model.hf_dir")
        ...
    if __name__ == "__main__":
        cli.run(main)          # instead of absl.app.run(main)

`run` prints a `rstar_jax.errors.UserError` (a bad config value, a missing path, a stale run
directory, an incompatible checkpoint) as one absl ``logging.error`` line and exits with status
2; any other exception keeps its full traceback (it is a bug to report).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence

from absl import app, logging

from rstar_jax.errors import UserError

USAGE_ERROR_EXIT = 2
# The launcher that runs each config mode (a recipe's variant sets ``mode``).
LAUNCHER_OF_MODE = {"rl": "launchers.train", "sft": "launchers.sft", "eval": "launchers.eval"}


def run(main: Callable[[Sequence[str]], object]) -> None:
  """`absl.app.run(main)` with `UserError` reported as one line and exit status 2; so is a
  ``--config.x.y=v`` override naming a field the config does not have."""
  app.run(wrap(main), flags_parser=parse_flags)


def parse_flags(argv: Sequence[str]):
  """`absl.app.parse_flags_with_usage` where the user errors raised while flags are parsed
  (a recipe's ``get_config`` rejecting a variant; ml_collections rejecting an override of an
  unknown field, which it raises as a KeyError / AttributeError with a traceback) exit 2
  with one line."""
  try:
    return app.parse_flags_with_usage(argv)
  except UserError as e:
    _fail(str(e))
  except (KeyError, AttributeError) as e:
    msg = unknown_override(e, argv)
    if msg is None:
      raise
    _fail(msg)


def unknown_override(err: BaseException, argv: Sequence[str]) -> str | None:
  """``config.rl.gruop_size: unknown field; did you mean group_size`` for ml_collections'
  error on the override ``--config.rl.gruop_size=4`` in ``argv``; None when ``err`` is not
  about an override there."""
  while err.args and isinstance(err.args[0], BaseException):  # AttributeError(KeyError(..))
    err = err.args[0]
  text = str(err.args[0]) if err.args else str(err)
  m = re.match(r"""\s*['"]?([\w-]+)""", text)
  if not m:
    return None
  key = m.group(1)
  hint = re.search(r'Did you mean "([^"]+)"', text)
  for arg in argv[1:]:
    o = re.match(r"--(\w+)\.([\w.]+)(=|$)", arg)
    if not o:
      continue
    parts = o.group(2).split(".")
    if key in parts:
      path = ".".join([o.group(1)] + parts[: parts.index(key) + 1])
      return f"{path}: unknown field" + (f"; did you mean {hint.group(1)}" if hint else "")
  return None


def _fail(msg: str) -> None:
  # Flags are not parsed yet, so absl logging would add a "logging before flag parsing" line.
  sys.stderr.write("ERROR: " + " ".join(msg.split()) + "\n")
  sys.exit(USAGE_ERROR_EXIT)


def wrap(main: Callable[[Sequence[str]], object]) -> Callable[[Sequence[str]], object]:
  """``main`` with `UserError` turned into one error line and ``SystemExit(2)``."""

  def wrapped(argv):
    try:
      return main(argv)
    except UserError as e:
      logging.error("%s", " ".join(str(e).split()))
      sys.exit(USAGE_ERROR_EXIT)

  wrapped.__name__ = getattr(main, "__name__", "main")
  wrapped.__doc__ = main.__doc__
  return wrapped


def check_dir(path: str, field: str, *, must_exist: bool = True) -> None:
  """``path`` (the value of config field / flag ``field``) is a directory; empty is allowed
  (the field is unset)."""
  if not path:
    return
  if os.path.isdir(path):
    return
  if os.path.exists(path):
    raise UserError(f"{field}: expected a directory, got {path!r} (a file)")
  if must_exist:
    raise UserError(f"{field}: expected an existing directory, got {path!r} (not found)")


def check_workdir(path: str, field: str = "--workdir") -> None:
  """``path`` is, or can be created as, a writable directory (checked without creating it)."""
  if not path:
    raise UserError(f"{field}: expected a directory path, got an empty value")
  path = os.path.abspath(path)
  if os.path.exists(path) and not os.path.isdir(path):
    raise UserError(f"{field}: {path!r} is a file, expected a directory")
  parent = path
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise UserError(f"{field}: cannot create {path!r}: {parent!r} is a file, not a directory")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise UserError(f"{field}: cannot write under {parent!r} (permission denied)")


def typed_config(cfg, mode: str, launcher: str, **convert_kw):
  """The typed `RunConfig` of launcher ``launcher``'s ``--config``, which must be a ``mode``
  config: a recipe's ``:sft`` variant given to ``launchers.train`` (or the reverse) is one
  line naming the right launcher, not a list of fields the other mode lacks. Conversion
  problems (unknown or bad fields) are `ConfigError`s, also `UserError`s."""
  from rstar_jax.config import from_config_dict

  got = cfg.mode if "mode" in cfg else mode
  if got != mode:
    right = LAUNCHER_OF_MODE.get(got, "")
    raise UserError(
      f"{launcher}: --config is a {got!r} config, expected a {mode!r} one"
      + (f" (run it with {right}, or pass the recipe's :{mode} variant)" if right else "")
    )
  return from_config_dict(cfg, mode, **convert_kw)


def check_model_dirs(run) -> None:
  """The typed config's ``model.hf_dir`` / ``model.tokenizer_dir``, when set, are directories."""
  check_dir(run.model.hf_dir, "config.model.hf_dir")
  check_dir(run.model.tokenizer_dir, "config.model.tokenizer_dir")
