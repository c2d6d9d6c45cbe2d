"""A call's process whose parent (the template, or its PID namespace's leader) dies before the
death signal is armed must not run the call: a uid switch clears PR_SET_PDEATHSIG, and at the
`uid` level no PID namespace takes the orphan down, so it would run on as a sandbox uid after
its pool is gone (seen under load in test_threats_template's killed-template test)."""

import os
import resource
import time

from rstar_jax.tools import sandbox_template as st


def _cfg():
  return {
    "limits": {
      "max_open_files": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
      "max_output_bytes": 1 << 30,
      "max_procs": 4096,
    },
    "as_limit": resource.RLIM_INFINITY,
    "drop_uid": False,  # the host uid: the check does not depend on the switch
    "seccomp": None,
    "call_env_set": True,
  }


def _run_after_parent_death(tmp_path, pass_parent):
  """Forks A, which forks B; B records A's pid, waits until A is dead, then drops to the call's
  user. Returns what B wrote once orphaned: b"orphan;" and, if `_drop_to_user` returned, b"returned"."""
  r, w = os.pipe()
  a = os.fork()
  if a == 0:
    try:
      b = os.fork()
      if b == 0:
        os.close(r)
        parent = os.getppid()
        os.write(w, b"R")  # ready: A may die now
        deadline = time.monotonic() + 20
        while os.getppid() == parent and time.monotonic() < deadline:
          time.sleep(0.01)
        os.write(w, b"orphan;")
        st._drop_to_user(_cfg(), os.getuid(), str(tmp_path), 30, parent if pass_parent else None)
        os.write(w, b"returned")
        os._exit(0)
      os.close(w)
      os.read(r, 1)
    finally:
      os._exit(0)
  os.close(w)
  os.waitpid(a, 0)  # A gone: B is an orphan now
  out = b""
  while chunk := os.read(r, 64):
    out += chunk
  os.close(r)
  return out


def test_orphaned_call_process_exits_before_running(tmp_path):
  assert _run_after_parent_death(tmp_path, pass_parent=True) == b"orphan;"


def test_without_the_recorded_parent_the_orphan_would_run(tmp_path):
  # The control: the same orphan, with nothing to compare against, goes on into the call.
  assert _run_after_parent_death(tmp_path, pass_parent=False) == b"orphan;returned"
