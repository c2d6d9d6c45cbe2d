"""Ctrl-C at a step boundary: a SIGINT that arrives while a loop records a step (its new state,
data position and metric row) is held until the record is complete, so an interrupted run's
checkpoint and its metrics log name the same last step."""

from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def sigint_deferred():
  """Runs the body with SIGINT held; a SIGINT received meanwhile is raised as
  KeyboardInterrupt when the body ends. A no-op off the main thread or when SIGINT is not
  Python's default handler (a caller that installed its own keeps it)."""
  if (
    threading.current_thread() is not threading.main_thread()
    or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
  ):
    yield
    return
  pending = []
  previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous)
  if pending:
    raise KeyboardInterrupt
