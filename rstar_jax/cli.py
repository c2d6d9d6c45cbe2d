"""Launcher edge: user errors as one line, bugs as tracebacks, paths checked before any work.

    from rstar_jax import cli
    def main(argv):
        cli.check_workdir(_WORKDIR.value)
        cli.check_dir(cfg.model.hf_dir, "config.model.hf_dir")
        ...
    if __name__ == "__main__":
        cli.run(main)          # instead of absl.app.run(main)

`run` prints a `rstar_jax.errors.UserError` (a bad config value, a missing path, a stale run
directory, an incompatible checkpoint) as one absl ``logging.error`` line and exits with status
2; any other exception keeps its full traceback (it is a bug to report).
"""
from __future__ import annotations

import os
import sys
from typing import Callable, Sequence

from absl import app, logging

from rstar_jax.errors import UserError

USAGE_ERROR_EXIT = 2


def run(main: Callable[[Sequence[str]], object]) -> None:
    """`absl.app.run(main)` with `UserError` reported as one line and exit status 2."""
    app.run(wrap(main))


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
        raise UserError(f"{field}: cannot create {path!r}: {parent!r} is a file, not a "
                        "directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{field}: cannot write under {parent!r} (permission denied)")
