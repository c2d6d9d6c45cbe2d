"""One run per workdir: a launcher holds an exclusive lock on ``<workdir>/.lock[.<process>]``
for its lifetime, so a second launch into the same workdir stops with one line instead of
writing into the first run's checkpoints and metrics.

The lock is a POSIX record lock (`fcntl.lockf`): the kernel drops it when the holding process
ends however it ends (kill -9 included), so a crashed run never leaves it stuck, and a forked
child (a code-pool worker) does not inherit it. Each JAX process of a multi-process run locks
its own file (its process index from the launcher's environment), so the processes of one run
do not exclude each other while process i of a second run is refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time

from rstar_jax.errors import UserError

_HELD: dict[str, int] = {}  # path -> fd, open for the life of the process
_PROCESS_ENV = ("RSTAR_PROCESS_ID", "JAX_PROCESS_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")


class WorkdirBusyError(UserError):
  """Another live process holds the workdir's lock."""


def process_index_from_env() -> int:
  """This process's index in a multi-process job, from the launcher's variables (0 if none)."""
  for name in _PROCESS_ENV:
    v = os.environ.get(name, "")
    if v.isdigit():
      return int(v)
  return 0


def lock_path(workdir: str, process_index: int | None = None) -> str:
  i = process_index_from_env() if process_index is None else process_index
  return os.path.join(os.path.abspath(workdir), ".lock" if i == 0 else f".lock.{i}")


def acquire(workdir: str, field: str = "--workdir", process_index: int | None = None) -> str:
  """Locks ``workdir`` for this process (created if missing); returns the lock file's path.

  Raises `WorkdirBusyError` (one line: the holder's pid, host, command and start time) when
  another live process holds it. Idempotent within a process.
  """
  path = lock_path(workdir, process_index)
  if path in _HELD:
    return path
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
  try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    holder = _read_holder(fd)
    os.close(fd)
    raise WorkdirBusyError(
      f"{field}: {os.path.dirname(path)} is in use by another run ({holder}); wait for it to "
      f"end or give another {field} (the lock {path} goes away when that process ends)"
    ) from None
  info = {
    "pid": os.getpid(),
    "host": socket.gethostname(),
    "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime()),
    "command": " ".join(sys.argv)[:300],
  }
  os.ftruncate(fd, 0)
  os.pwrite(fd, json.dumps(info).encode(), 0)
  _HELD[path] = fd
  return path


def release(workdir: str, process_index: int | None = None) -> None:
  """Drops this process's lock on ``workdir`` (a supervisor's restart does not need this: a
  lock dies with its process)."""
  fd = _HELD.pop(lock_path(workdir, process_index), None)
  if fd is not None:
    os.close(fd)


def _read_holder(fd: int) -> str:
  try:
    info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
  except (OSError, ValueError):
    info = {}
  if not info:
    return "its pid is not recorded yet"
  return (
    f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}: "
    f"{info.get('command', '')}"
  )
