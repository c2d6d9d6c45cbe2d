"""Third red team (issue 40), the sandbox classes, at every isolation level this machine offers:
memory the kernel bounds (1), statuses and completion no call can write (2), descriptor hygiene
and liveness (3), channels through the shared install (4). Network probes: none."""

import os
import signal
import types

import pytest
from pool_helpers import level_available, level_pool, template_children, use_level_runner

from rstar_jax.tools import sandbox_template
from rstar_jax.tools.code_pool import ISOLATION_LEVELS

runner = use_level_runner()

LIMIT_MB = 64
RESERVE_MB = 192  # mapped (never touched) by each template: what a call may unmap


@pytest.fixture(scope="module", params=ISOLATION_LEVELS)
def mpool(level_runner, request):
  """A small-memory pool per level (no numpy/sympy: a call's baseline stays a few MiB) whose
  templates hold a large untouched private mapping, as a real template does."""
  p = level_pool(
    level_runner,
    request.param,
    memory_limit_mb=LIMIT_MB,
    preload=("json",),
    warmup_code=(  # kept alive past the warm-up's own namespace; its address for the calls
      "import ctypes, mmap, sys\n"
      f"sys.reserve = mmap.mmap(-1, {RESERVE_MB} << 20, flags=mmap.MAP_PRIVATE)\n"
      "view = ctypes.c_char.from_buffer(sys.reserve)\n"
      "sys.reserve_addr = ctypes.addressof(view)\n"
      "del view\n"
    ),
    timeout_s=20.0,
    session_timeout_cpu_s=1,
  )
  yield p
  level_runner.run(p.close())


def _need_cgroups(pool):
  if pool._cg is None:
    pytest.skip(f"no writable memory + pids cgroup here: {pool.memory_bound}")


def _peak_bytes(pool):
  """The highest memory use the kernel recorded in any of the pool's call cgroups."""
  peaks = []
  for base in pool._cg.base.values():
    for root, _, files in os.walk(base):
      for name in ("memory.max_usage_in_bytes", "memory.peak"):
        if name in files and root.rsplit("/", 1)[-1].startswith("c"):
          with open(os.path.join(root, name)) as f:
            peaks.append(int(f.read().split()[0]))
  return max(peaks, default=0)


def _held_mb(stdout):
  lines = [ln for ln in stdout.split() if ln.isdigit()]
  return int(lines[-1]) if lines else 0


# --- class 1: memory the kernel bounds ------------------------------------------------------
_PIPES = """
import fcntl, os
held, pipes = 0, []
for i in range(120):
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
    except OSError:
        pass
    os.set_blocking(w, False)
    try:
        while True:
            held += os.write(w, b"x" * 65536)
    except BlockingIOError:
        pass
    pipes.append((r, w))
    os.write(1, b"%d\\n" % (held >> 20))
"""

_VMSPLICE = """
import ctypes, fcntl, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
libc.munmap.argtypes = libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
class Iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
libc.vmsplice.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
MB2 = 2 << 20
held, pipes = 0, []
for i in range(120):
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, 1031, 1 << 20)
    except OSError:
        pass
    raw = libc.mmap(None, 2 * MB2, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
    addr = (raw + MB2 - 1) & ~(MB2 - 1)  # a huge-page aligned 2 MiB inside
    libc.madvise(addr, MB2, 14)  # MADV_HUGEPAGE: one page pinned keeps the whole huge page
    ctypes.memset(addr, 1, MB2)
    iov = Iov(addr, MB2)
    n = libc.vmsplice(w, ctypes.byref(iov), 1, 2)  # SPLICE_F_NONBLOCK
    libc.munmap(raw, 2 * MB2)  # no longer mapped: outside RLIMIT_AS and the RSS account
    held += max(n, 0)
    pipes.append((r, w))
    os.write(1, b"%d\\n" % (held >> 20))
"""

_UNMAP_RESERVE = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
import sys
# By the address the template recorded: the kernel may have merged the mapping with a neighbour.
if libc.munmap(sys.reserve_addr, {RESERVE_MB} << 20) == 0:
    os.write(1, b"unmapped\\n")
held, keep = 0, []
while held < 4 * {LIMIT_MB}:
    keep.append(bytearray(4 << 20))  # zero-filled: every page touched
    held += 4
    os.write(1, b"%d\\n" % held)
"""


@pytest.mark.parametrize(
  "name,code", [("pipe buffers", _PIPES), ("vmsplice", _VMSPLICE), ("unmap", _UNMAP_RESERVE)]
)
def test_memory_outside_the_address_space_is_bounded(runner, mpool, name, code):
  """Pipe buffers, pages vmsplice'd into pipes and then unmapped, and memory allocated after
  unmapping what the template had mapped but never touched: none is in RLIMIT_AS's count, all
  are in the kernel's memory cgroup account. Each ends as memory_limit, and the kernel's record
  of the call's peak never passes the limit."""
  _need_cgroups(mpool)
  r = runner.run(mpool.execute(code, timeout_s=20.0))
  assert r.status == "memory_limit", (name, r.status, r.stdout[-200:], r.stderr[-500:])
  assert _held_mb(r.stdout) <= LIMIT_MB, (name, r.stdout[-200:])
  assert _peak_bytes(mpool) <= LIMIT_MB << 20
  if name == "unmap":
    assert r.stdout.startswith("unmapped"), r.stdout[:200]
  r = runner.run(mpool.execute("print('next')"))  # the slot is usable again
  assert (r.status, r.stdout) == ("ok", "next\n"), r


def test_memfd_secret_is_refused(runner, mpool):
  """memfd_secret pages are outside every address-space and RSS account: refused outright."""
  if os.uname().machine not in ("x86_64", "aarch64"):
    pytest.skip(f"no seccomp filter on {os.uname().machine}")
  code = (
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "print(libc.syscall(447, 0), ctypes.get_errno())"
  )
  r = runner.run(mpool.execute(code))
  assert (r.status, r.stdout) == ("ok", "-1 1\n"), r  # EPERM


def test_a_session_is_bounded_across_its_calls(runner, mpool):
  """A session keeps its cgroup for its lifetime: memory held by earlier calls counts."""
  _need_cgroups(mpool)
  hold = "import os\nkeep = globals().setdefault('keep', [])\nkeep.append(bytearray(24 << 20))"
  statuses = [runner.run(mpool.execute(hold, session_id="grow")).status for _ in range(4)]
  runner.run(mpool.close_session("grow"))
  assert statuses[0] == "ok" and "memory_limit" in statuses, statuses


def test_pids_are_bounded_by_the_cgroup(runner, level_runner):
  """With subprocesses allowed, the call's pids cgroup caps its tasks (processes and threads),
  also where RLIMIT_NPROC does not apply (the rlimits level, run as root)."""
  pool = level_pool(
    level_runner,
    "rlimits",
    allow_subprocesses=True,
    max_procs=8,
    preload=("json",),
    warmup_code="",
  )
  try:
    _need_cgroups(pool)
    code = (
      "import os, time\nn = 0\nfor _ in range(40):\n    try:\n        pid = os.fork()\n"
      "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n"
      "        os._exit(0)\n    n += 1\nprint(n)"
    )
    r = runner.run(pool.execute(code, timeout_s=10.0))
    assert r.status == "ok" and int(r.stdout) < 8, r
  finally:
    level_runner.run(pool.close())


# --- class 2: statuses and completion no call can write -------------------------------------
def _usage(seconds):
  return types.SimpleNamespace(ru_utime=seconds, ru_stime=0.0)


def test_only_the_kernels_cpu_limit_kill_reads_as_a_timeout():
  kill = sandbox_template.Template._cpu_limit_kill
  assert kill(signal.SIGXCPU, _usage(3.0), 3)  # soft limit
  assert kill(signal.SIGKILL, _usage(4.0), 3)  # hard limit (PID 1 ignores SIGXCPU)
  # CPU burnt in many threads, then the call's own crash or kill: its ending, not a timeout.
  assert not kill(signal.SIGSEGV, _usage(9.0), 3)
  assert not kill(signal.SIGABRT, _usage(3.9), 3)
  assert not kill(signal.SIGKILL, _usage(3.4), 3)  # well before the hard limit: its own kill


_BURN_THEN_CRASH = """
import ctypes, signal, time
signal.signal(signal.SIGXCPU, signal.SIG_IGN)  # run on past the soft limit (to the hard one)
while time.process_time() < TARGET:
    pass
ctypes.string_at(0)  # a real crash (SIGSEGV from the kernel)
"""


def test_cpu_burnt_past_the_soft_limit_then_a_crash_is_the_crash(runner, mpool):
  """A session call that burns CPU past its RLIMIT_CPU soft limit (ignoring SIGXCPU) and then
  crashes comes back as its crash, not `timeout` (the old rule took any signal death with the
  CPU account at the limit for one). One thread and the kernel's CPU count: no wall-clock
  race, so it holds on a loaded machine too (the wall deadline is far)."""
  soft = mpool.config.session_timeout_cpu_s
  code = f"TARGET = {soft + 0.3}\n" + _BURN_THEN_CRASH
  r = runner.run(mpool.execute(code, session_id="crasher", timeout_s=60.0))
  runner.run(mpool.close_session("crasher"))
  assert r.status == "error" and r.exit_code == 128 + signal.SIGSEGV, r
  assert "session terminated" in r.stderr, r


_THREADS_BURN = """
import os, threading, time, zlib
buf = os.urandom(1 << 18)
def burn(k):
    while True:
        zlib.compress(buf, 9)  # releases the GIL: the threads' CPU adds up in parallel
        os.write(1, b"%d %.3f\\n" % (k, time.thread_time()))
for k in range(2):
    threading.Thread(target=burn, args=(k,), daemon=True).start()
time.sleep(120)
"""


def test_cpu_limit_counts_every_thread_by_the_kernels_count(runner, mpool):
  """RLIMIT_CPU is the kernel's count of every thread's CPU: two threads burning in parallel
  are stopped when their sum reaches the session's limit, each having used less than it. What
  is asserted is what the kernel counted (each thread's own CPU clock), not a duration, so it
  holds however loaded the machine is (the wall deadline is far past the CPU limit)."""
  limit = mpool.config.session_timeout_cpu_s
  r = runner.run(mpool.execute(_THREADS_BURN, session_id="burner", timeout_s=60.0))
  runner.run(mpool.close_session("burner"))
  assert r.status == "timeout" and "session terminated" in r.stderr, r
  last = {}
  for line in r.stdout.splitlines():
    k, t = line.split()
    last[k] = float(t)
  assert set(last) == {"0", "1"}, r.stdout[-300:]
  # Killed at the limit of the sum: no single thread reached it (one thread's clock alone
  # would have had to), and together they did (less what the last writes missed).
  assert max(last.values()) < limit, last
  assert sum(last.values()) >= limit * 0.5, last


_FORGE_AND_STOP = """
import os, signal
for fd in range(0, 256):
    try:
        os.pwrite(fd, b"0\\n", 0)
    except OSError:
        pass
os.kill(os.getpid(), signal.SIGSTOP)
print("ran on")
"""


def test_writing_zero_everywhere_and_stopping_is_no_completion(runner, lpool):
  """Whatever a call writes to what it can reach, a stop of its own is not the end of a
  session call: the session ends there, reported as such, and nothing of it runs on."""
  runner.run(lpool.execute("x = 41", session_id="forger"))
  r = runner.run(lpool.execute(_FORGE_AND_STOP, session_id="forger", timeout_s=3.0))
  assert r.status == "error" and "stopped its own process" in r.stderr, r
  r = runner.run(lpool.execute("print('second')", session_id="forger"))
  assert (r.status, r.stdout) == ("ok", "second\n"), r
  runner.run(lpool.close_session("forger"))
  # A plain call is over only when its process exits: a stopped one is killed at its deadline
  # (as its namespace's PID 1 it cannot stop itself at all and runs to its end).
  r = runner.run(lpool.execute(_FORGE_AND_STOP, timeout_s=1.0))
  assert r.status == "timeout" or (r.status, r.stdout) == ("ok", "ran on\n"), r


# --- class 3: descriptor hygiene and liveness -----------------------------------------------


def test_a_sessions_pid1_holds_no_memfd(runner, lpool):
  """Descriptors the template receives are close-on-exec from their arrival: a session's PID 1
  (an exec'd `sleep`) holds none of another session's or call's memfds."""
  if lpool.isolation_level not in ("namespaces", "pidns"):
    pytest.skip(f"no per-session PID 1 at the {lpool.isolation_level} level (no PID namespace)")
  runner.run(lpool.execute("a = 1", session_id="first"))
  runner.run(lpool.execute("b = 2", session_id="second"))
  try:
    inits = template_children(lpool, "sleep")
    assert inits, "no session PID 1 found"
    held = []
    for pid in inits:
      for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
          target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
          continue
        if "memfd:" in target:
          held.append((pid, fd, target))
    assert held == [], held
  finally:
    runner.run(lpool.close_session("first"))
    runner.run(lpool.close_session("second"))


@pytest.mark.parametrize("kind", ["exec", "session"])
@pytest.mark.parametrize("level", ISOLATION_LEVELS)
def test_a_start_failing_after_fork_leaves_nothing(runner, level_runner, kind, level):
  """With the template's descriptors exhausted right after it received a call's memfds, the
  start fails (internal_error) and leaves no process behind: each one is tracked by a pidfd
  from the moment it exists, and killed and reaped when the next step fails."""
  import resource

  from pool_helpers import descendants, template_host_pid

  pool = level_pool(level_runner, level, preload=("json",), warmup_code="")
  try:
    tpid = template_host_pid(pool)
    before = descendants(tpid)
    soft, hard = resource.prlimit(tpid, resource.RLIMIT_NOFILE)
    # Room for the 4 memfds of the request, the call's mount namespace (made by the template at
    # every level but rlimits) and the session's PID 1 spawn, none for a pidfd.
    room = 4 + (level != "rlimits")
    resource.prlimit(
      tpid, resource.RLIMIT_NOFILE, (len(os.listdir(f"/proc/{tpid}/fd")) + room, hard)
    )
    try:
      sid = "starved" if kind == "session" else None
      r = runner.run(pool.execute("print('ran')", session_id=sid))
    finally:
      resource.prlimit(tpid, resource.RLIMIT_NOFILE, (soft, hard))
    assert r.status == "internal_error" and "failed to start" in r.stderr, r
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
      after = descendants(tpid)
      if after == before:
        break
      time.sleep(0.05)
    assert after == before, (before, after)
    r = runner.run(pool.execute("print('ran')", session_id=sid))
    assert (r.status, r.stdout) == ("ok", "ran\n"), r
  finally:
    level_runner.run(pool.close())


_SWEEP = """
import os, signal, sys, time, types
from rstar_jax.tools import sandbox_template
def sleeper(own_group):
  pid = os.fork()
  if pid == 0:
    if own_group:
      os.setsid()
    time.sleep(60)
    os._exit(0)
  return pid
closed = sleeper(False)  # a session closed (killed) but not reaped yet: the template's own
stray = sleeper(True)  # an escapee re-parented to the subreaper
tpl = types.SimpleNamespace(subreaper=True, calls={}, sessions={}, dying={7: {"pid": closed}})
sandbox_template.Template.sweep_orphans(tpl)
for pid, name in ((closed, "closed session"), (stray, "stray")):
  try:
    print(name, "left" if os.waitpid(pid, os.WNOHANG)[0] == 0 else "exited")
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
  except ChildProcessError:
    print(name, "reaped by the sweep")
"""


def test_the_orphan_sweep_leaves_closed_sessions_to_their_own_reap():
  # At rlimits the template is its calls' child subreaper and reaps every child that is no
  # call or session. A closed session waits (in `dying`) for its pidfd to say it is gone; the
  # sweep after another call's end reaped it first, the pidfd's wait4 then found no child and
  # the template died (all sessions lost): the rare restart at rlimits.
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = subprocess.run(
    [sys.executable, "-c", _SWEEP],
    env={**os.environ, "PYTHONPATH": root},
    capture_output=True,
    text=True,
    timeout=60,
  )
  # The closed session is still the template's to reap when its pidfd fires.
  assert out.stdout.splitlines() == ["closed session left", "stray reaped by the sweep"], (
    out.stdout,
    out.stderr,
  )


@pytest.mark.parametrize("level", ISOLATION_LEVELS)
def test_a_call_held_in_the_kernel_costs_only_itself(runner, level_runner, level):
  """A call whose process outlives its SIGKILL (held in the kernel: here frozen by a v1
  freezer cgroup, as a call stuck in sync(2) was) comes back as internal_error after its grace;
  the template, alive by its heartbeat, is not replaced, and another session keeps its state."""
  pool = level_pool(level_runner, level, reply_grace_s=1.0, preload=("json",))
  frozen = f"/sys/fs/cgroup/freezer/rstar_test_{os.getpid()}"
  try:
    _need_cgroups(pool)
    if not os.path.isdir("/sys/fs/cgroup/freezer"):
      pytest.skip("no v1 freezer hierarchy to hold a call's process in the kernel")
    from rstar_jax.tools import cgroups

    assert runner.run(pool.execute("x = 42", session_id="keep")).status == "ok"
    before = set(cgroups.tree_pids(pool._cg.base["memory"]))
    os.makedirs(frozen, exist_ok=True)

    async def scenario():
      import asyncio

      task = asyncio.ensure_future(pool.execute("import time\ntime.sleep(60)", timeout_s=1.0))
      new = set()
      while not new:
        await asyncio.sleep(0.02)
        new = set(cgroups.tree_pids(pool._cg.base["memory"])) - before
      for pid in new:
        with open(f"{frozen}/cgroup.procs", "w") as f:
          f.write(str(pid))
      with open(f"{frozen}/freezer.state", "w") as f:
        f.write("FROZEN")
      return await task

    r = runner.run(scenario())
    assert r.status == "internal_error" and "held in the kernel" in r.stderr, r
    assert pool._templates[0].restarts == 0
    r = runner.run(pool.execute("print(x)", session_id="keep"))
    assert (r.status, r.stdout) == ("ok", "42\n"), r
  finally:
    if os.path.isdir(frozen):
      with open(f"{frozen}/freezer.state", "w") as f:
        f.write("THAWED")
      import time

      for _ in range(200):
        try:
          os.rmdir(frozen)
          break
        except OSError:
          time.sleep(0.05)
    level_runner.run(pool.close())


# --- class 4: no channel through the shared install; sync is the call's own -----------------
_CHANNELS = """
import ctypes, errno, fcntl, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    r = libc.syscall(nr, *args)
    return 0 if r >= 0 else ctypes.get_errno()
shared = os.open(os.__file__, os.O_RDONLY)  # the read-only install every call sees
out = {}
try:
    fcntl.flock(shared, fcntl.LOCK_SH | fcntl.LOCK_NB)
    out["flock"] = 0
except OSError as e:
    out["flock"] = e.errno
try:
    fcntl.fcntl(shared, fcntl.F_GETLK, bytes(32))
    out["getlk"] = 0
except OSError as e:
    out["getlk"] = e.errno
out["inotify"] = call(294, 0)  # inotify_init1
out["fanotify"] = call(300, 0x200, 0)  # FAN_CLASS_NOTIF | FAN_REPORT_FID: allowed unprivileged
folder = os.open(os.path.dirname(os.__file__), os.O_RDONLY | os.O_DIRECTORY)
try:
    fcntl.fcntl(folder, 1026, 1)  # F_NOTIFY, DN_ACCESS: a signal when anyone reads in there
    out["dnotify"] = 0
except OSError as e:
    out["dnotify"] = e.errno
out["cachestat"] = call(451, shared, 0, 0, 0)
out["fadvise_bad_fd"] = call(221, -1, 0, 0, 4)  # POSIX_FADV_DONTNEED on no file: a no-op
out["readahead_bad_fd"] = call(187, -1, 0, 4096)
out["preadv2"] = call(327, shared, 0, 0, 0, 0, 8)  # RWF_NOWAIT
out["sync"] = call(162)
out["syncfs_bad_fd"] = call(306, -1)  # answered without looking at the fd: not done at all
out["pageout_bad_addr"] = call(28, 1, 4096, 21)  # MADV_PAGEOUT
print(sorted(out.items()))
"""


def test_channels_through_the_shared_install_are_closed(runner, lpool):
  """Two concurrent calls try every channel of the red team's and those next to them: locks on
  the shared install (flock needs no write access; a POSIX read lock shows only through
  F_GETLK), inotify, fanotify and dnotify watches, the page cache (evicted by fadvise /
  MADV_PAGEOUT / readahead, probed by RWF_NOWAIT reads or cachestat), and sync/syncfs of what
  they did not write: each is refused or a no-op in both."""
  if os.uname().machine != "x86_64":
    pytest.skip(f"the raw syscall numbers are x86_64's, machine is {os.uname().machine}")
  rs = runner.run(lpool.execute_many([{"code": _CHANNELS}, {"code": _CHANNELS}]))
  expected = [
    ("cachestat", 38),  # ENOSYS
    ("dnotify", 22),  # EINVAL
    ("fadvise_bad_fd", 0),
    ("fanotify", 1),  # EPERM
    ("flock", 37),  # ENOLCK
    ("getlk", 37),
    ("inotify", 1),  # EPERM
    ("pageout_bad_addr", 0),
    ("preadv2", 38),  # ENOSYS
    ("readahead_bad_fd", 0),
    ("sync", 0),
    ("syncfs_bad_fd", 0),
  ]
  for r in rs:
    assert (r.status, r.stdout) == ("ok", f"{expected}\n"), r


def test_own_files_still_fsync_and_lock_free_code_runs(runner, lpool):
  """fsync of the call's own file works; ordinary file I/O is untouched by the filter."""
  code = (
    "import os\nfd = os.open('f', os.O_CREAT | os.O_RDWR)\nos.write(fd, b'x' * 10)\n"
    "os.fsync(fd)\nos.fdatasync(fd)\nprint(os.pread(fd, 10, 0) == b'x' * 10, os.preadv(fd, "
    "[bytearray(3)], 0))"
  )
  r = runner.run(lpool.execute(code))
  assert (r.status, r.stdout) == ("ok", "True 3\n"), r


# --- class 5: the template's privilege, as it is -------------------------------------------
def _status(pid):
  out = {}
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      k, _, v = line.partition(":")
      out[k] = v.split()
  return out


def _template_privilege(pool):
  """(same user namespace as the host, uid_map fields, host uid, CapEff, CapPrm, CapBnd) of
  template 0, read from the kernel."""
  from pool_helpers import template_host_pid

  tpid = template_host_pid(pool)
  st = _status(tpid)
  same = os.readlink(f"/proc/{tpid}/ns/user") == os.readlink("/proc/self/ns/user")
  with open(f"/proc/{tpid}/uid_map") as f:
    uid_map = f.read().split()
  caps = (int(st[k][0], 16) for k in ("CapEff", "CapPrm", "CapBnd"))
  return (same, uid_map, int(st["Uid"][1]), *caps)


def test_the_templates_privilege_is_what_the_threat_model_says(runner, lpool):
  """What an escape from a call into its template would hold, read from the kernel (the
  template's /proc status, uid map and user namespace), at every level. `namespaces`: the
  template is the root of a user namespace of its own, an unprivileged host uid (past the
  pool's sandbox uids) with the sandbox uids mapped 1:1 and nothing else; its capabilities are
  that namespace's only. `pidns` / `uid`: uid 0 of the host's namespace (no bubblewrap to hold
  a namespace's mounts), capabilities narrowed to TEMPLATE_CAPS (bubblewrap, run as real root,
  had left every capability the host has, module loading included). Every root level: an
  empty bounding set. Calls hold no capability and run as a pool uid."""
  level = lpool.isolation_level
  same, uid_map, uid, eff, prm, bnd = _template_privilege(lpool)
  keep = sum(1 << c for c in sandbox_template.TEMPLATE_CAPS)
  if level == "namespaces":
    lo, hi = lpool._templates[0].uid_range
    root = lpool._templates[0].userns_root
    assert not same and uid == root and not lo <= root < hi and root != 0, (uid_map, uid)
    assert uid_map == ["0", str(root), "1", str(lo), str(lo), str(hi - lo)], uid_map
    assert (eff, prm, bnd) == (keep, keep, 0), (hex(eff), hex(prm), hex(bnd))
    assert "own user namespace" in lpool.template_privilege, lpool.template_privilege
  else:
    assert same and uid_map == ["0", "0", "4294967295"], (level, uid_map)
  host_eff = int(_status("self")["CapEff"][0], 16)
  if level == "rlimits":
    assert uid == os.geteuid() and eff == host_eff, (uid, hex(eff))
  elif level != "namespaces":
    assert uid == 0 and (eff, prm, bnd) == (keep & host_eff, keep & host_eff, 0), (level, hex(eff))
    assert not eff & (1 << 16), "CAP_SYS_MODULE kept"
  code = (
    "import os\nst = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
    "print(int(st['CapEff'], 16), int(st['CapBnd'], 16), os.geteuid())"
  )
  r = runner.run(lpool.execute(code))
  eff, bnd, uid = (int(x) for x in r.stdout.split())
  if level == "rlimits":
    assert uid == os.geteuid(), r
  else:
    assert (eff, bnd) == (0, 0) and uid != 0, r


def test_template_userns_off_keeps_the_host_root(runner, level_runner):
  """`template_userns="off"` (and machines whose kernel refuses the namespace) run the
  template as the host's root inside bubblewrap, and the pool says so."""
  pool = level_pool(level_runner, "namespaces", template_userns="off", preload=("json",))
  try:
    same, uid_map, uid, eff, _, bnd = _template_privilege(pool)
    assert same and uid == 0 and uid_map == ["0", "0", "4294967295"] and bnd == 0, uid_map
    assert pool.template_privilege == "the host's root (template_userns off)"
    r = runner.run(pool.execute("print('runs')"))
    assert (r.status, r.stdout) == ("ok", "runs\n"), r
  finally:
    level_runner.run(pool.close())


def test_a_kernel_refusing_the_user_namespace_is_reported(runner, level_runner, caplog):
  """Where the probe fails (here: its cached answer replaced by a failure), `auto` runs the
  template as the host's root and says so in `template_privilege` and a warning; `required`
  refuses to start and gives back what it took (cgroups, uid range)."""
  import logging

  from rstar_jax.tools import code_pool

  if level_available("namespaces"):
    pytest.skip(level_available("namespaces"))
  cfg = code_pool.PoolConfig(isolation="namespaces")
  key = (cfg.python, tuple(code_pool._bwrap_binds(cfg)))
  mp = pytest.MonkeyPatch()
  mp.setitem(code_pool._USERNS_PROBED, key, "unshare(CLONE_NEWUSER): Operation not permitted")
  try:

    def ours():  # this process's pool cgroups only (another test process may make its own)
      from rstar_jax.tools import cgroups

      version, dirs = cgroups.find()
      d = next(iter(dirs.values())) if version else None
      mine = f"rstar_code_pool_{os.getpid()}_"
      return {n for n in os.listdir(d) if n.startswith(mine)} if d else set()

    before = ours()
    with pytest.raises(RuntimeError, match="template_userns='required' but the probe failed"):
      level_pool(level_runner, "namespaces", template_userns="required", preload=("json",))
    assert ours() == before
    with caplog.at_level(logging.WARNING, logger="rstar_jax.tools.code_pool"):
      pool = level_pool(level_runner, "namespaces", preload=("json",))
    try:
      same, _, uid, *_ = _template_privilege(pool)
      assert same and uid == 0
      assert pool.template_privilege.startswith("the host's root (no user namespace: unshare")
      assert any("no user namespace" in m for m in caplog.messages), caplog.text
      r = runner.run(pool.execute("print('runs')"))
      assert (r.status, r.stdout) == ("ok", "runs\n"), r
    finally:
      level_runner.run(pool.close())
  finally:
    mp.undo()


# --- the levels themselves ------------------------------------------------------------------
def test_without_a_writable_cgroup_the_level_is_lower_and_reported(runner, level_runner, caplog):
  """A machine whose cgroup hierarchy cannot be written runs on RLIMIT_AS alone and says so
  (`pool.memory_bound`, a warning naming why); `cgroups="required"` refuses to start instead.
  (The hierarchy is made unwritable by pointing the pool at directories that do not exist.)"""
  import logging

  from rstar_jax.tools import cgroups

  gone = f"/nonexistent_rstar_{os.getpid()}"
  fake = lambda *a, **k: (1, {"memory": f"{gone}/memory", "pids": f"{gone}/pids"})  # noqa: E731
  mp = pytest.MonkeyPatch()
  mp.setattr(cgroups, "find", fake)
  try:
    with pytest.raises(RuntimeError, match="cgroups='required' but cgroup v1 not writable"):
      level_pool(level_runner, "rlimits", cgroups="required", preload=("json",), warmup_code="")
    with caplog.at_level(logging.WARNING, logger="rstar_jax.tools.code_pool"):
      pool = level_pool(level_runner, "rlimits", preload=("json",), warmup_code="")
    try:
      assert pool._cg is None
      assert pool.memory_bound.startswith("RLIMIT_AS only, a lower level: cgroup v1 not writable")
      assert gone in pool.memory_bound, pool.memory_bound
      assert any("no memory + pids cgroup per call" in m for m in caplog.messages), caplog.text
      r = runner.run(pool.execute("print('runs')"))
      assert (r.status, r.stdout) == ("ok", "runs\n"), r
    finally:
      level_runner.run(pool.close())
  finally:
    mp.undo()


def test_bubblewrap_gets_the_interpreter_by_a_path_that_exists_inside(tmp_path):
  """Only real paths are bound into bubblewrap: an interpreter reached through a symlinked
  directory (a worktree's `.venv -> /elsewhere/.venv`) is started by its resolved directory, so
  the `namespaces` level does not silently fall to `pidns` (it did, in such a worktree)."""
  from rstar_jax.tools.code_pool import PoolConfig, _bwrap_binds, _sandbox_python

  real = tmp_path / "real_venv" / "bin"
  real.mkdir(parents=True)
  (real / "python").symlink_to("/usr/bin/python3")
  (tmp_path / "link").symlink_to(tmp_path / "real_venv")
  cfg = PoolConfig(python=str(tmp_path / "link" / "bin" / "python"))
  assert _sandbox_python(cfg) == str(real / "python")
  binds = _bwrap_binds(cfg)
  assert any(str(real) == b or str(real).startswith(b + "/") for b in binds), binds
