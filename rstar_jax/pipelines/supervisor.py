"""A launcher that supervises itself: ``--max_restarts=N`` reruns the run's learner processes
when one of them crashes, from the last checkpoint, with the same command (so the same config
and, through the checkpoint, the same data position).

    python -m launchers.train --config=... --workdir=D --max_restarts=3
    python -m launchers.train --config=... --workdir=D --max_restarts=3 \\
        --num_processes=2 --devices_per_process=2          # several JAX processes, one host

The launcher process becomes the supervisor (it imports no JAX): it starts the learner
process(es) -- the same launcher command with ``RSTAR_SUPERVISED=1`` and, for
``--num_processes`` > 1, the ``RSTAR_*`` variables of `rstar_jax.distributed.init` (a fresh
coordinator port per attempt) -- each in its own session, and waits. When every process exits 0
the run is done. When one exits otherwise, the others are ended (SIGTERM, SIGKILL after
``grace_s``: a JAX process whose peer died would wait in a collective) and, unless the exit
code is one a restart cannot fix (`NO_RESTART`: 2 = a user error, 130 = Ctrl-C), every process
is started again; the launchers resume from ``<workdir>/ckpt``. A half-written checkpoint is
never restored (orbax writes ``<step>.orbax-checkpoint-tmp*`` and renames it when complete;
`learner.checkpoint.Checkpointer` removes leftovers), and the workdir lock
(`workdir_lock`) dies with the killed process.

For tools (a chaos benchmark), the supervisor keeps ``<workdir>/supervisor.json`` current:
``{"max_restarts", "restarts", "attempts": [{"attempt", "pids", "started", "ended",
"exits": [{"process", "pid", "returncode", "signal"}], "resumed_from_step"}], "state"}`` with
``state`` "running" / "restarting" / "done" / "failed" / "interrupted"; the running attempt's
``pids`` are the learner processes to kill. Ctrl-C on the supervisor goes to every learner
process as SIGINT (they checkpoint and stop) and ends with status 130; a SIGTERM is forwarded
the same way (status 143); a supervisor killed with SIGKILL takes its learners with it
(PR_SET_PDEATHSIG). Each learner sees ``RSTAR_RESTARTS`` (the restarts before it started),
which `metrics_log.MetricsWriter` writes into every metric row as ``restarts``. A restart drops
`FIRST_START_ONLY` flags (``--discard_stale``), so a recipe edited since the first start stops
the run (run_record's one line, exit 2) instead of replacing it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from rstar_jax.errors import complete_steps

ENV_SUPERVISED = "RSTAR_SUPERVISED"
# The attempt a learner process belongs to (0 = the first start): each metric row's
# ``restarts`` (`restarts_from_env`).
ENV_RESTARTS = "RSTAR_RESTARTS"
STATE_FILE = "supervisor.json"
# Exit codes a restart cannot fix: a user error (rc 2: the same command fails the same way)
# and Ctrl-C (130: the user asked to stop). Everything else, signals included, is a crash.
NO_RESTART = (2, 130)
SUPERVISOR_FLAGS = ("max_restarts", "num_processes", "devices_per_process")
# Flags that act on the first start only: ``--discard_stale`` deletes a workdir written with
# another config. On a restart the workdir holds this run's own checkpoints; if the recipe file
# was edited meanwhile, the restart must stop (run_record names the changed fields, exit 2), not
# wipe the run and start it over with the new config.
FIRST_START_ONLY = ("discard_stale",)


@dataclasses.dataclass
class Exit:
  process: int
  pid: int
  returncode: int  # as Popen reports it: -N for signal N
  signal: str | None = None

  def describe(self) -> str:
    how = f"was killed by {self.signal}" if self.signal else f"exited with status {self.returncode}"
    return f"learner process {self.process} (pid {self.pid}) {how}"


def is_supervised_child() -> bool:
  return os.environ.get(ENV_SUPERVISED) == "1"


def restarts_from_env() -> int | None:
  """How many times the supervisor restarted this run before starting this process (None when
  not supervised)."""
  v = os.environ.get(ENV_RESTARTS, "")
  return int(v) if v.isdigit() else None


def _drop_flags(args: Sequence[str], names: Sequence[str], valued: bool) -> list[str]:
  """``args`` without ``--name=v`` / ``--name v`` (``valued``) / ``--name`` / ``--noname``."""
  out, skip = [], False
  for a in args:
    if skip:
      skip = False
      continue
    name = a.split("=", 1)[0].lstrip("-")
    if a.startswith("-") and (name in names or name in {f"no{f}" for f in names}):
      skip = valued and "=" not in a and name in names
      continue
    out.append(a)
  return out


def child_argv(argv: Sequence[str], module: str) -> list[str]:
  """The learner command: ``python -m <module>`` with ``argv[1:]`` minus the supervisor's own
  flags (``--max_restarts=3`` or ``--max_restarts 3``)."""
  return [sys.executable, "-m", module, *_drop_flags(argv[1:], SUPERVISOR_FLAGS, valued=True)]


def restart_argv(argv: Sequence[str]) -> list[str]:
  """The learner command of a restart: `FIRST_START_ONLY` flags dropped."""
  return [argv[0], *_drop_flags(argv[1:], FIRST_START_ONLY, valued=False)]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def process_envs(
  num_processes: int, devices_per_process: int = 0, attempt: int = 0
) -> list[dict[str, str]]:
  """The environment of each learner process of one attempt (a fresh coordinator port)."""
  base = dict(
    os.environ, **{ENV_SUPERVISED: "1", ENV_RESTARTS: str(attempt), "PYTHONUNBUFFERED": "1"}
  )
  if devices_per_process:
    flags = " ".join(
      f
      for f in base.get("XLA_FLAGS", "").split()
      if not f.startswith("--xla_force_host_platform_device_count=")
    )
    base["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices_per_process}"
    base["XLA_FLAGS"] = base["XLA_FLAGS"].strip()
  if num_processes <= 1:
    return [base]
  coord = f"127.0.0.1:{free_port()}"
  return [
    dict(
      base,
      RSTAR_COORDINATOR=coord,
      RSTAR_NUM_PROCESSES=str(num_processes),
      RSTAR_PROCESS_ID=str(i),
    )
    for i in range(num_processes)
  ]


class Supervisor:
  """Runs ``argv`` as ``num_processes`` learner processes, restarting all of them after a crash
  of any, at most ``max_restarts`` times; `run` returns the exit status for the launcher.

  Args:
    argv: the learner command (`child_argv`).
    workdir: the run's directory (its ``ckpt/`` is the resume point; ``supervisor.json``).
    max_restarts: restarts allowed over the run (0: run once).
    num_processes / devices_per_process: local multi-process JAX (`process_envs`).
    grace_s: how long the survivors of a crash get between SIGTERM and SIGKILL.
    say: where the supervisor's one-line messages go (default: stderr).
  """

  def __init__(
    self,
    argv: Sequence[str],
    workdir: str,
    *,
    max_restarts: int,
    num_processes: int = 1,
    devices_per_process: int = 0,
    grace_s: float = 10.0,
    poll_s: float = 0.2,
    say: Callable[[str], None] | None = None,
  ):
    if max_restarts < 0:
      raise ValueError(f"--max_restarts: expected >= 0, got {max_restarts}")
    if num_processes < 1:
      raise ValueError(f"--num_processes: expected >= 1, got {num_processes}")
    self.argv = list(argv)
    self.workdir = os.path.abspath(workdir)
    self.max_restarts = max_restarts
    self.num_processes = num_processes
    self.devices_per_process = devices_per_process
    self.grace_s = grace_s
    self.poll_s = poll_s
    self.say = say or (lambda m: print(f"supervisor: {m}", file=sys.stderr, flush=True))
    self.state = {"max_restarts": max_restarts, "restarts": 0, "attempts": [], "state": "running"}
    self._procs: list[subprocess.Popen] = []

  # ------------------------------------------------------------------ state file
  def _write_state(self) -> None:
    os.makedirs(self.workdir, exist_ok=True)
    path = os.path.join(self.workdir, STATE_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(self.state, f, indent=1)
    os.replace(tmp, path)

  def last_checkpoint_step(self) -> int | None:
    steps = complete_steps(os.path.join(self.workdir, "ckpt"))
    return steps[-1] if steps else None

  # ------------------------------------------------------------------ processes
  def _start(self, attempt: int) -> None:
    argv = self.argv if attempt == 0 else restart_argv(self.argv)
    self._procs = [
      # A session of its own: the terminal's Ctrl-C reaches the supervisor only (it forwards
      # it), and a kill of the group reaches what the process started (code-pool workers).
      subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=_die_with_parent)
      for env in process_envs(self.num_processes, self.devices_per_process, attempt)
    ]
    self.state["attempts"].append(
      {
        "attempt": attempt,
        "pids": [p.pid for p in self._procs],
        "started": time.time(),
        "ended": None,
        "exits": [],
        "resumed_from_step": self.last_checkpoint_step(),
      }
    )
    self.state["state"] = "running"
    self._write_state()

  def _signal_all(self, sig: int) -> None:
    # Every group, a dead leader's too: what a killed learner started (code-pool workers)
    # lives on in its group and would hold its resources into the next attempt.
    for p in self._procs:
      try:
        os.killpg(p.pid, sig)
      except (ProcessLookupError, PermissionError):
        pass

  def _end_survivors(self) -> None:
    self._signal_all(signal.SIGTERM)
    deadline = time.monotonic() + self.grace_s
    while any(p.poll() is None for p in self._procs) and time.monotonic() < deadline:
      time.sleep(self.poll_s)
    self._signal_all(signal.SIGKILL)
    for p in self._procs:
      p.wait()

  def _wait_attempt(self) -> Exit | None:
    """Waits until every process exited 0 (returns None) or one failed (returns its Exit;
    the others are ended)."""
    while True:
      failed = None
      for i, p in enumerate(self._procs):
        rc = p.poll()
        if rc is not None and rc != 0 and failed is None:
          failed = _exit_of(i, p)
      if failed is not None:
        self._end_survivors()
        return failed
      if all(p.poll() == 0 for p in self._procs):
        return None
      time.sleep(self.poll_s)

  def _record_end(self) -> None:
    a = self.state["attempts"][-1]
    a["ended"] = time.time()
    a["exits"] = [dataclasses.asdict(_exit_of(i, p)) for i, p in enumerate(self._procs)]

  def gave_up_line(self, failed: Exit) -> str:
    step = self.last_checkpoint_step()
    where = (
      f"the last checkpoint is step {step} ({os.path.join(self.workdir, 'ckpt', str(step))})"
      if step is not None
      else "there is no checkpoint yet"
    )
    return (
      f"{failed.describe()}; no restart left ({self.state['restarts']} of "
      f"--max_restarts={self.max_restarts} used); {where}: rerun the same command to resume"
    )

  # ------------------------------------------------------------------ the loop
  def run(self) -> int:
    """Runs the attempts; returns the exit status: 0, the failed process's status (a signal
    N as 128 + N) when no restart is left or allowed, 130 after Ctrl-C, 143 after SIGTERM."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
      return self._run()
    finally:
      signal.signal(signal.SIGTERM, previous)

  def _run(self) -> int:
    attempt = 0
    try:
      self._start(attempt)
      while True:
        failed = self._wait_attempt()
        self._record_end()
        if failed is None:
          self.state["state"] = "done"
          self._write_state()
          return 0
        code = failed.returncode
        if code in NO_RESTART or attempt >= self.max_restarts:
          self.state["state"] = "failed"
          self._write_state()
          if code not in NO_RESTART:
            self.say(self.gave_up_line(failed))
          return code if code > 0 else 128 - code  # a signal as the shell reports it
        attempt += 1
        self.state["restarts"] = attempt
        self.state["state"] = "restarting"
        self._write_state()
        step = self.last_checkpoint_step()
        where = (
          f"the checkpoint of step {step}" if step is not None else "the start (no checkpoint)"
        )
        self.say(
          f"{failed.describe()}; restart {attempt} of {self.max_restarts} from {where}"
          + (f", all {self.num_processes} processes" if self.num_processes > 1 else "")
        )
        self._start(attempt)
    except KeyboardInterrupt:
      # Ctrl-C: the learners checkpoint and stop on SIGINT (their own "interrupted at step N"
      # line); a second Ctrl-C kills them.
      return self._stop(signal.SIGINT, 130)
    except _Terminated:
      # The supervisor is told to stop (a scheduler's SIGTERM): so are the learners.
      return self._stop(signal.SIGTERM, 143)

  def _stop(self, sig: int, code: int) -> int:
    self._signal_all(sig)
    for p in self._procs:
      try:
        p.wait()
      except (KeyboardInterrupt, _Terminated):
        self._signal_all(signal.SIGKILL)
        p.wait()
    if self.state["attempts"]:
      self._record_end()
    self.state["state"] = "interrupted"
    self._write_state()
    return code


class _Terminated(Exception):
  pass


def _raise_terminated(signum, frame):
  raise _Terminated


def _die_with_parent() -> None:
  """In the learner process before exec: SIGKILL when the supervisor dies (Linux
  PR_SET_PDEATHSIG), so a supervisor killed with -9 leaves no learner running unsupervised.
  SIGINT back to its default: a supervisor started in the background (``cmd &`` in a script)
  has it ignored, and Python would then give the learner no KeyboardInterrupt to checkpoint on
  when the supervisor forwards a Ctrl-C."""
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  try:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
  except (OSError, AttributeError):  # not Linux: the learners outlive a killed supervisor
    pass


def _exit_of(i: int, p: subprocess.Popen) -> Exit:
  rc = p.returncode if p.returncode is not None else p.poll()
  rc = 0 if rc is None else rc
  sig = signal.Signals(-rc).name if rc < 0 else None
  return Exit(process=i, pid=p.pid, returncode=rc, signal=sig)
