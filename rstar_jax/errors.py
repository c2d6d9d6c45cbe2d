"""Errors that are the user's to fix (a config value, a path, an old run directory).

Launchers print a `UserError` as one line and exit with status 2 (`rstar_jax.cli.run`); any
other exception is a bug and keeps its traceback. Raise a `UserError` (or a subclass) when the
message alone tells the user what to change: name the config field or path, what was expected
and what was found.
"""

from __future__ import annotations

import errno
import os
import re


class UserError(Exception):
  """A problem with the user's input (config, paths, run directory); the message is the fix."""


class CheckpointedStop(Exception):
  """An outside failure the run cannot go on through (e.g. every rollout server gone for longer
  than ``rollout.server_timeout_s``): the loop writes a checkpoint first, then the launcher
  prints the message as one line and exits with `exit_code` (EX_TEMPFAIL: rerunning the same
  command resumes once the failure is fixed)."""

  exit_code = 75


# How a full disk (or quota) reaches us: an OSError from our own writes, or orbax/TensorStore's
# ValueError text ("RESOURCE_EXHAUSTED ... No space left on device [os_error_code='28']").
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)
_DISK_FULL_TEXT = re.compile(
  r"No space left on device|Disk quota exceeded|File too large|Read-only file system|"
  r"os_error_code='(28|122|27|30)'"
)


def disk_full_reason(err: BaseException) -> str | None:
  """'no space left on device' (or the quota / size / read-only reason) when ``err`` or an
  exception it was raised from is a failed write of that kind; None otherwise."""
  seen = set()
  while err is not None and id(err) not in seen:
    seen.add(id(err))
    if isinstance(err, OSError) and err.errno in _DISK_FULL_ERRNOS:
      return os.strerror(err.errno).lower()
    m = _DISK_FULL_TEXT.search(str(err))
    if m:
      code = m.group(1)
      return os.strerror(int(code)).lower() if code else m.group(0).lower()
    err = err.__cause__ or err.__context__
  return None


def complete_steps(directory: str) -> list[int]:
  """Steps with a committed checkpoint folder in ``directory`` (an unfinished orbax write is
  ``<step>.orbax-checkpoint-tmp*`` and is never listed)."""
  try:
    names = os.listdir(directory)
  except OSError:
    return []
  return sorted(int(n) for n in names if n.isdigit() and os.path.isdir(os.path.join(directory, n)))


def write_failed_line(directory: str, step: int | None, reason: str) -> str:
  """``checkpoint <dir>: cannot write step N (no space left on device); the last good
  checkpoint is step M (<dir>/M): free space, then rerun the same command to resume``."""
  good = [s for s in complete_steps(directory) if step is None or s != step]
  what = f"step {step}" if step is not None else "a checkpoint"
  last = (
    f"the last good checkpoint is step {good[-1]} ({os.path.join(directory, str(good[-1]))})"
    if good
    else "there is no complete checkpoint yet"
  )
  return (
    f"checkpoint {directory}: cannot write {what} ({reason}); {last}: free space, then "
    "rerun the same command to resume"
  )
