"""Errors that are the user's to fix (a config value, a path, an old run directory).

Launchers print a `UserError` as one line and exit with status 2 (`rstar_jax.cli.run`); any
other exception is a bug and keeps its traceback. Raise a `UserError` (or a subclass) when the
message alone tells the user what to change: name the config field or path, what was expected
and what was found.
"""

from __future__ import annotations


class UserError(Exception):
  """A problem with the user's input (config, paths, run directory); the message is the fix."""


class CheckpointedStop(Exception):
  """An outside failure the run cannot go on through (e.g. every rollout server gone for longer
  than ``rollout.server_timeout_s``): the loop writes a checkpoint first, then the launcher
  prints the message as one line and exits with `exit_code` (EX_TEMPFAIL: rerunning the same
  command resumes once the failure is fixed)."""

  exit_code = 75
