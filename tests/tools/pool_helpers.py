"""Helpers shared by the code-tool tests (importable; conftest.py is not)."""

import asyncio
import functools
import os
import shutil

import pytest

from rstar_jax.tools.code_pool import CodePool, PoolConfig, detect_isolation

# conftest.py plants it in the host's environment before any pool starts; no sandboxed call may
# ever see it. (Not planted here: sandboxed functions import this module too.)
SECRET = "rstar-secret-canary-7f3a"


class Runner:
  """Runs coroutines on one persistent loop (the pool's subprocess pipes belong to it)."""

  def __init__(self):
    self.loop = asyncio.new_event_loop()

  def run(self, coro, timeout=120):
    return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

  def close(self):
    self.loop.run_until_complete(self.loop.shutdown_asyncgens())
    self.loop.close()


def sandbox_pids(uid_lo, uid_hi):
  """Host pids of live (non-zombie) processes running as a sandbox uid (anything a call left
  behind). Zombies are skipped: killed orphans wait for the host's PID 1 to reap them, which
  on a busy machine may take a while, and they no longer run or hold memory."""
  out = []
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/status") as f:
        uid = state = None
        for line in f:
          if line.startswith("State:"):
            state = line.split()[1]
          elif line.startswith("Uid:"):
            uid = int(line.split()[1])
            break
      if uid is not None and uid_lo <= uid < uid_hi and state != "Z":
        out.append(int(name))
    except OSError:
      pass
  return out


def pool_uid_range(pool):
  if pool.isolation_level == "rlimits":
    # Calls run as the host's uid and the pool claims no uid range: the default first range
    # may be another live pool's (concurrent test runs), whose calls are not this pool's.
    return 0, 0
  lo = pool._uid_base
  return lo, lo + len(pool._templates) * pool.config.uids_per_template


def descendants(root):
  """Host pids of every process below `root` (any uid: also the root-owned PID-1 helpers)."""
  children = {}
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
      continue
    children.setdefault(ppid, []).append(int(name))
  out, todo = set(), [root]
  while todo:
    for c in children.get(todo.pop(), []):
      if c not in out:
        out.add(c)
        todo.append(c)
  return out


def template_host_pid(pool, index=0):
  """Host pid of template `index` (inside bwrap it is a grandchild of the spawned process)."""
  root = pool._templates[index].proc.pid
  for pid in sorted(descendants(root) | {root}):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        comm = open(f"/proc/{pid}/comm", "rb").read()
        # The template's mount namespace reaper shares its cmdline (a fork): told by its comm.
        if b"sandbox_template.py" in f.read() and b"bwrap" not in comm and b"reaper" not in comm:
          return pid
    except OSError:
      pass
  raise AssertionError("template process not found")


@functools.cache
def template_children(pool, comm):
  """Pids of the processes under template `pool`'s host process whose comm is `comm`."""
  out = []
  for pid in descendants(template_host_pid(pool)):
    try:
      with open(f"/proc/{pid}/comm") as f:
        if f.read().strip() == comm:
          out.append(pid)
    except OSError:  # gone since the walk
      pass
  return out


def level_available(level):
  """ "" when this machine offers `level`, else why not."""
  if level in ("namespaces", "pidns", "uid") and os.geteuid() != 0:
    return f"the {level} level needs root (running as uid {os.geteuid()})"
  if level == "namespaces" and shutil.which("bwrap") is None:
    return "the namespaces level needs bubblewrap (bwrap not on PATH)"
  try:
    detect_isolation(PoolConfig(isolation=level))
  except RuntimeError as e:
    return str(e)
  return ""


def level_pool(runner, level, **overrides):
  """A started pool at exactly `level`, or a skip saying why this machine cannot offer it."""
  why = level_available(level)
  if why:
    pytest.skip(why)
  kw = dict(
    num_workers=4,
    num_templates=1,
    timeout_s=3.0,
    memory_limit_mb=256,
    max_output_bytes=1 << 16,
    isolation=level,
  )
  kw.update(overrides)
  p = CodePool(**kw)
  runner.run(p.start())
  assert p.isolation_level == level
  return p


def use_level_runner():
  """For a test module whose tests use `lpool`: its `runner` is the per-level pools' loop."""

  @pytest.fixture(scope="module")
  def runner(level_runner):
    return level_runner

  return runner


def bound_back_names(pool_config: PoolConfig | None = None) -> set[str]:
  """First names, under /tmp & co, of the host paths a call imports from (a checkout or venv in
  /tmp): they are bound back read-only into every call's scratch, so a scratch listing shows
  them and nothing else the host has there."""
  from rstar_jax.tools.code_pool import _bwrap_binds

  tests_dir = os.path.dirname(os.path.abspath(__file__))
  cfg = pool_config or PoolConfig(extra_ro_binds=(tests_dir,))
  out = set()
  for p in _bwrap_binds(cfg):
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
      if p.startswith(d + "/"):
        out.add(p[len(d) + 1 :].split("/")[0])
  return out
