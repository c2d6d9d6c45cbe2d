"""Warm template process: preloads modules once, then forks one isolated child per call.

Runs as a standalone script (stdlib only, plus `wire.py` next to it and the modules it is told
to preload) so it can start inside a bubblewrap sandbox that sees only a read-only view of the
Python install and the project. The host (`code_pool.py`) talks to it over fd 0/1 with
`wire` frames (lengths, integers, UTF-8: never pickle); the template never runs user code
itself, and every call's process closes all fds but its own memfds before user code runs, so no
user code can reach those pipes.

Per call (see `_child_main`):
  template --fork--> user process (PID 2 of a fresh PID namespace whose PID 1 is `sleep`,
                     fresh network + IPC namespaces, rlimits, unprivileged uid, seccomp filter)
Killing the namespace's PID 1 makes the kernel kill everything in it, including double-forked
`setsid` escapees. Without PID namespaces the template kills every process of the slot's uid.
A call is over when its process exits (pidfd), never because of something it wrote.

Sessions (ASTER): the session process runs a trusted loop that stops itself with SIGSTOP after
each call; the template learns of the stop from waitid(WSTOPPED), writes the next call's code
into a memfd while the process is stopped, and resumes it with SIGCONT. A stop is not a frame:
forging it (user code stopping itself) only stops the user's own code, and the template checks
at each stop that no other thread or process of the session is still running.

stdout/stderr go to memfds whose size is capped by RLIMIT_FSIZE, so a child that prints
gigabytes is stopped by the kernel (SIGXFSZ/EFBIG) and neither the template nor the host ever
holds more than the cap.
"""

import _signal
import ast
import builtins
import collections
import ctypes
import gc
import io
import linecache
import os
import resource
import select
import signal
import socket
import struct
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wire  # noqa: E402  (stdlib-only sibling; the template runs with -I, without its dir on the path)

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
CLONE_THREAD = 0x00010000
# Every namespace flag clone/unshare accept (NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER,
# NEWPID, NEWNET).
_NS_FLAGS = (
  0x00000080
  | 0x00020000
  | 0x02000000
  | 0x04000000
  | 0x08000000
  | 0x10000000
  | 0x20000000
  | 0x40000000
)
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
# Statuses come only from what the template observed (its own kill, the CPU time and peak
# memory the kernel accounted, the bytes it read): an exit code is only ever `ok` (0) or
# `error`. A call counts as out of memory when its peak resident memory grew by at least this
# fraction of `memory_limit_mb` (a single request past the limit is refused by the kernel before
# any page is used: that is the program's own MemoryError, an `error`).
MEMORY_OBSERVED_FRACTION = 0.5
# How far below RLIMIT_CPU the precise CPU account of a process killed at that limit may read
# (the kernel compares tick-sampled time with the limit; see Template._cpu_limit_kill).
CPU_ACCOUNT_SLACK_S = 0.5
USER_FILENAME = "<code>"
MAX_REQUEST_BYTES = 1 << 30  # a request holds code + stdin; the host caps both far lower
MAX_TIMEOUT_S = 86400.0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
  ctypes.c_char_p,
  ctypes.c_char_p,
  ctypes.c_char_p,
  ctypes.c_ulong,
  ctypes.c_char_p,
]

_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


# ---------------------------------------------------------------------------------------------
# framing (host <-> template): u32 length + one `wire` value; never pickle.
def _read_exact(fd, n):
  chunks, got = [], 0
  while got < n:
    b = os.read(fd, n - got)
    if not b:
      raise EOFError
    chunks.append(b)
    got += len(b)
  return b"".join(chunks)


def read_frame(fd, max_bytes=MAX_REQUEST_BYTES):
  n = wire.frame_length(_read_exact(fd, 4), max_bytes)
  return wire.decode(_read_exact(fd, n))


def write_frame(fd, obj):
  view = memoryview(wire.frame(obj))
  while view:
    n = os.write(fd, view)
    view = view[n:]


# ---------------------------------------------------------------------------------------------
# seccomp: a small classic-BPF filter installed in every call's process after its uid drop.
# Syscall numbers per architecture (from the kernel's syscall tables).
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SYSCALLS = {
  "x86_64": {
    "shmat": 30,
    "shmctl": 31,
    "semop": 65,
    "semctl": 66,
    "semtimedop": 220,
    "msgsnd": 69,
    "msgrcv": 70,
    "msgctl": 71,
    "mq_open": 240,
    "mq_unlink": 241,
    "unshare": 272,
    "setns": 308,
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "chroot": 161,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "shmget": 29,
    "semget": 64,
    "msgget": 68,
    "bpf": 321,
    "userfaultfd": 323,
    "perf_event_open": 298,
    "io_uring_setup": 425,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "ptrace": 101,
    "clone3": 435,
    "clone": 56,
    "fork": 57,
    "vfork": 58,
    "socket": 41,
    "socketpair": 53,
    "execve": 59,
    "execveat": 322,
    "memfd_create": 319,
    "memfd_secret": 447,
    "sync": 162,
    "syncfs": 306,
    "flock": 73,
    "fcntl": 72,
    "inotify_init": 253,
    "inotify_init1": 294,
    "fadvise64": 221,
    "madvise": 28,
    "readahead": 187,
    "preadv2": 327,
    "pwritev2": 328,
    "io_setup": 206,
    "io_submit": 209,
    "fanotify_init": 300,
    "cachestat": 451,
  },
  "aarch64": {
    "shmat": 196,
    "shmctl": 195,
    "semop": 193,
    "semctl": 191,
    "semtimedop": 192,
    "msgsnd": 189,
    "msgrcv": 188,
    "msgctl": 187,
    "mq_open": 180,
    "mq_unlink": 181,
    "unshare": 97,
    "setns": 268,
    "mount": 40,
    "umount2": 39,
    "pivot_root": 41,
    "chroot": 51,
    "add_key": 217,
    "request_key": 218,
    "keyctl": 219,
    "shmget": 194,
    "semget": 190,
    "msgget": 186,
    "bpf": 280,
    "userfaultfd": 282,
    "perf_event_open": 241,
    "io_uring_setup": 425,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "ptrace": 117,
    "clone3": 435,
    "clone": 220,
    "socket": 198,
    "socketpair": 199,
    "execve": 221,
    "execveat": 281,
    "memfd_create": 279,
    "memfd_secret": 447,
    "sync": 81,
    "syncfs": 267,
    "flock": 32,
    "fcntl": 25,
    "inotify_init1": 26,
    "fadvise64": 223,
    "madvise": 233,
    "readahead": 213,
    "preadv2": 286,
    "pwritev2": 287,
    "io_setup": 0,
    "io_submit": 2,
    "fanotify_init": 262,
    "cachestat": 451,
  },
}
_ALWAYS_BLOCKED = (
  "unshare",
  "setns",
  "mount",
  "umount2",
  "pivot_root",
  "chroot",
  "add_key",
  "request_key",
  "keyctl",
  "shmget",
  "semget",
  "msgget",
  # Existing SysV objects by id and POSIX message queues too: without a per-call IPC namespace
  # (the default, sockets off) the host's or another call's objects would otherwise be open.
  "shmat",
  "shmctl",
  "semop",
  "semctl",
  "semtimedop",
  "msgsnd",
  "msgrcv",
  "msgctl",
  "mq_open",
  "mq_unlink",
  "bpf",
  "userfaultfd",
  "perf_event_open",
  "io_uring_setup",
  "open_tree",
  "move_mount",
  "fsopen",
  "fsconfig",
  "fsmount",
  "fspick",
  "ptrace",
  # A call's own memfds would be memory outside RLIMIT_AS (its output memfds are the
  # template's, capped by RLIMIT_FSIZE); secret memory is outside every account but the cgroup.
  "memfd_create",
  "memfd_secret",
  # Channels between concurrent calls through the shared read-only install (issue 40, class 4):
  # watches on its files fire on another call's opens and reads.
  "inotify_init",
  "inotify_init1",
  # fanotify marks (unprivileged since Linux 5.13) report another call's accesses the same way.
  "fanotify_init",
)
# Answered as if done, without doing anything (RET_ERRNO 0): advice a call cannot be refused
# meaningfully, but which would reach beyond it. `sync`/`syncfs` would write back (and wait
# for) every file of the host, not the call's; `fadvise64` (DONTNEED) and `readahead` evict or
# load pages of the shared page cache that another call can then observe.
_NO_OPS = ("sync", "syncfs", "fadvise64", "readahead")
# Refused with ENOSYS (libc and Python fall back to the plain calls): `preadv2`/`pwritev2`
# (RWF_NOWAIT reads tell which pages of a shared file are cached) and Linux AIO (its
# RWF_NOWAIT too). io_uring is refused above.
# `cachestat` (Linux 6.5) reports which pages of a file are cached: ENOSYS, as on an older kernel.
_UNSUPPORTED = ("preadv2", "pwritev2", "io_setup", "io_submit", "cachestat")
# Argument-dependent rules: (syscall, argument index, values, errno or None for a no-op).
# `flock` needs no write access, so two calls could signal through locks on the shared install:
# refused (ENOLCK: "no locks available", as on a filesystem without them). For POSIX locks the
# lock a call takes on a shared file (read-only: only F_RDLCK) is visible to another call only
# through F_GETLK / F_OFD_GETLK: those are refused. MADV_COLD / MADV_PAGEOUT on a file mapping
# would evict shared page cache: a no-op. F_NOTIFY (dnotify: a signal when another process
# reads a file of a watched directory) gets EINVAL, as on a kernel built without dnotify.
_F_GETLK, _F_OFD_GETLK, _F_NOTIFY, _MADV_COLD, _MADV_PAGEOUT = 5, 36, 1026, 20, 21
_ENOLCK, _EINVAL = 37, 22
_ARG_RULES = (
  ("fcntl", 1, (_F_GETLK, _F_OFD_GETLK), _ENOLCK),
  ("fcntl", 1, (_F_NOTIFY,), _EINVAL),
  ("madvise", 2, (_MADV_COLD, _MADV_PAGEOUT), None),
)
_RET_ALLOW = 0x7FFF0000
_EPERM, _EAGAIN, _ENOSYS = 1, 11, 38


def _ret_errno(e):
  return 0x00050000 | e


def seccomp_program(machine, allow_subprocesses, allow_sockets):
  """Classic BPF instructions (code, jt, jf, k) of the call filter, or None if unsupported.

  Blocked with EPERM: namespaces (unshare, setns, clone with a CLONE_NEW* flag: so no user
  namespace), mounts, keyrings (add_key/request_key/keyctl), SysV IPC (creation and use of
  existing objects by id), POSIX message queues, bpf,
  userfaultfd, perf events, io_uring, ptrace, memfd_create; other ABIs (x32 / 32-bit). clone3
  gets ENOSYS so libc falls back to clone, whose flags the filter can read. Without
  `allow_subprocesses`, fork/vfork/clone-without-CLONE_THREAD get EAGAIN (threads share the
  address space, so RLIMIT_AS then bounds the whole call) and execve/execveat EPERM; without `allow_sockets`, socket/socketpair get EPERM.
  """
  arch = _AUDIT_ARCH.get(machine)
  nrs = _SYSCALLS.get(machine)
  if arch is None:
    return None
  ld_w, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
  prog = []
  # Each rule: (syscall nr, action). Built as "jeq nr ? next : skip 1; ret action".
  rules = [(nrs[n], _ret_errno(_EPERM)) for n in _ALWAYS_BLOCKED if n in nrs]
  rules.append((nrs["clone3"], _ret_errno(_ENOSYS)))
  rules += [(nrs[n], _ret_errno(0)) for n in _NO_OPS]
  rules += [(nrs[n], _ret_errno(_ENOSYS)) for n in _UNSUPPORTED]
  rules.append((nrs["flock"], _ret_errno(_ENOLCK)))
  if not allow_subprocesses:
    for n in ("fork", "vfork"):
      if n in nrs:
        rules.append((nrs[n], _ret_errno(_EAGAIN)))
    # exec would swap the template-sized address space (whose size RLIMIT_AS was set from)
    # for a small fresh one, leaving the whole template's size as extra room under the limit.
    rules += [(nrs["execve"], _ret_errno(_EPERM)), (nrs["execveat"], _ret_errno(_EPERM))]
  if not allow_sockets:
    rules += [(nrs["socket"], _ret_errno(_EPERM)), (nrs["socketpair"], _ret_errno(_EPERM))]
  prog.append((ld_w, 0, 0, 4))  # A = arch
  prog.append((jeq, 1, 0, arch))
  prog.append((ret, 0, 0, _ret_errno(_EPERM)))  # foreign ABI (e.g. int 0x80): refuse
  prog.append((ld_w, 0, 0, 0))  # A = syscall nr
  if machine == "x86_64":
    prog.append((jge, 0, 1, 0x40000000))  # x32 ABI
    prog.append((ret, 0, 0, _ret_errno(_EPERM)))
  for nr, action in rules:
    prog.append((jeq, 0, 1, nr))
    prog.append((ret, 0, 0, action))
  for name, idx, values, err in _ARG_RULES:
    # "nr ? (A = low 32 bits of args[idx]; each value ? ret; A = nr again) : skip the block"
    prog.append((jeq, 0, 2 * len(values) + 2, nrs[name]))
    prog.append((ld_w, 0, 0, 16 + 8 * idx))
    for v in values:
      prog.append((jeq, 0, 1, v))
      prog.append((ret, 0, 0, _ret_errno(err or 0)))
    prog.append((ld_w, 0, 0, 0))
  # clone: inspect the low 32 bits of its flags (args[0], offset 16 on little endian).
  prog.append((jeq, 0, 6 if not allow_subprocesses else 4, nrs["clone"]))
  prog.append((ld_w, 0, 0, 16))
  prog.append((jset, 0, 1, _NS_FLAGS))
  prog.append((ret, 0, 0, _ret_errno(_EPERM)))
  if not allow_subprocesses:
    prog.append((jset, 1, 0, CLONE_THREAD))
    prog.append((ret, 0, 0, _ret_errno(_EAGAIN)))
  prog.append((ret, 0, 0, _RET_ALLOW))  # a thread, or clone allowed
  prog.append((ret, 0, 0, _RET_ALLOW))  # every other syscall
  return prog


class _SockFilter(ctypes.Structure):
  _fields_ = [
    ("code", ctypes.c_uint16),
    ("jt", ctypes.c_uint8),
    ("jf", ctypes.c_uint8),
    ("k", ctypes.c_uint32),
  ]


class _SockFprog(ctypes.Structure):
  _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def build_seccomp(prog):
  """The filter as the ctypes structure prctl takes; built once in the template, before any
  fork, so a call's process only makes the syscall (no per-call Python work or CoW faults)."""
  arr = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
  return _SockFprog(len(prog), arr), arr  # arr: keeps the instructions alive


def install_seccomp(built):
  if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(built[0]), 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


# ---------------------------------------------------------------------------------------------
# user-side executor (runs in the user process only)
def _user_traceback(exc):
  """Formats `exc` keeping only frames of the user's code, so line numbers are the user's."""
  tb = exc.__traceback__
  frames = [f for f in traceback.extract_tb(tb) if f.filename == USER_FILENAME]
  lines = []
  if frames:
    lines.append("Traceback (most recent call last):\n")
    lines.extend(traceback.format_list(frames))
  lines.extend(traceback.format_exception_only(type(exc), exc))
  return "".join(lines)


def _new_std_streams():
  sys.stdin, sys.stdout, sys.stderr = _std_streams()


def _std_streams():
  # closefd=False: the fds belong to the process, a new wrapper per call must not close them.
  return (
    io.TextIOWrapper(
      io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8", errors="replace"
    ),
    io.TextIOWrapper(
      io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
      encoding="utf-8",
      errors="backslashreplace",
      write_through=False,
    ),
    io.TextIOWrapper(
      io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
      encoding="utf-8",
      errors="backslashreplace",
      write_through=True,
    ),
  )


# A plain call's std streams, built once in the template (on /dev/null, seekable like the
# memfds the call's fds 0-2 become): every call is forked from the same untouched, empty
# wrappers, so building them (codec lookup, buffers: ~80 copy-on-write faults) is not per call.
_PREBUILT_STREAMS = None


def _prebuild_std_streams():
  global _PREBUILT_STREAMS
  devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
  saved = [os.dup(fd) for fd in (0, 1, 2)]
  try:
    for fd in (0, 1, 2):
      os.dup2(devnull, fd)
    _PREBUILT_STREAMS = _std_streams()
  finally:
    for fd, keep in zip((0, 1, 2), saved):
      os.dup2(keep, fd)
      os.close(keep)
    os.close(devnull)


def _flush_std():
  for s in (sys.stdout, sys.stderr):
    try:
      s.flush()
    except BaseException:  # a closed or broken stream must not turn into a crash here
      pass


def _stdout_written():
  try:
    return os.lseek(1, 0, os.SEEK_CUR) > 0
  except OSError:
    return True


def exec_user_code(code, namespace):
  """Runs `code` IPython-style in `namespace`; returns the process exit code.

  The last expression statement is evaluated separately and its repr printed when the
  call produced no stdout and the value is not None.
  """
  try:
    lines = code.splitlines(keepends=True)
    linecache.cache[USER_FILENAME] = (len(code), None, lines, USER_FILENAME)
    try:
      tree = ast.parse(code, USER_FILENAME, "exec")
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes in source
      sys.stderr.write("".join(traceback.format_exception_only(type(e), e)))
      return 1
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
      last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, USER_FILENAME, "exec"), namespace)
    if last is not None:
      value = eval(compile(last, USER_FILENAME, "eval"), namespace)
      if value is not None:
        sys.stdout.flush()
        if not _stdout_written():
          sys.stdout.write(repr(value) + "\n")
    return 0
  except SystemExit as e:
    if e.code is None:
      return 0
    if isinstance(e.code, int):
      return e.code & 0xFF
    sys.stderr.write(str(e.code) + "\n")
    return 1
  except BaseException as e:  # MemoryError, KeyboardInterrupt, RecursionError, ...: the user's
    try:
      sys.stderr.write(_user_traceback(e))
    except BaseException:
      pass
    return 1


def _warm_user_path():
  """Runs once in the template what every call's first pass through `exec_user_code` would
  otherwise set up in its own process (linecache's entry, the parse / compile / eval paths):
  ~25 fewer copy-on-write faults per call. Nothing of a call's is involved."""
  probe = "x = 1\nx\n"
  tree = ast.parse(probe, USER_FILENAME, "exec")
  last = ast.Expression(tree.body.pop().value)
  ns = _fresh_namespace()
  exec(compile(tree, USER_FILENAME, "exec"), ns)
  eval(compile(last, USER_FILENAME, "eval"), ns)
  linecache.cache[USER_FILENAME] = (len(probe), None, probe.splitlines(True), USER_FILENAME)
  del linecache.cache[USER_FILENAME]


MADV_COLLAPSE = 25  # Linux >= 6.1
HUGE_PAGE_BYTES = 2 << 20
# A 2 MiB range is collapsed only when this much of it is resident already: the holes are
# filled with zeroed pages, so the template's memory grows by at most 1/8 of what it moves.
HUGE_PAGE_MIN_RESIDENT = 0.875


def collapse_heap_to_huge_pages(maps="/proc/self/maps"):
  """Moves the template's preloaded heap (its private writable anonymous memory and the brk
  heap) into 2 MiB pages (MADV_COLLAPSE); returns the bytes moved.

  A call is a fork of this process and ends with its exit: the kernel copies the parent's page
  table entries at the fork and drops them at the exit, each 4 KiB page costing a reference
  count update on its page both ways (`copy_page_range` and `unmap_page_range`: over half of a
  trivial call's CPU, rstar_jax/tools/README.md). A 2 MiB page is one entry and one update
  while the call leaves it alone; a write splits only that call's mapping of it (the kernel's
  copy-on-write stays per 4 KiB page, charged to the writer). The flag that makes page faults
  allocate huge pages (MADV_HUGEPAGE) is not set: what a call allocates stays in 4 KiB pages.
  Best effort: a kernel without MADV_COLLAPSE, or no free 2 MiB block, leaves the 4 KiB pages.
  """
  page = os.sysconf("SC_PAGE_SIZE")
  vec = (ctypes.c_ubyte * (HUGE_PAGE_BYTES // page))()
  need = HUGE_PAGE_MIN_RESIDENT * len(vec)
  with open(maps) as f:
    lines = f.read().splitlines()
  moved = 0
  for line in lines:
    parts = line.split()
    if parts[1] != "rw-p" or (len(parts) > 5 and parts[5] != "[heap]"):
      continue  # file-backed or special ([stack], [vvar], named anonymous) mappings
    lo, hi = (int(x, 16) for x in parts[0].split("-"))
    first = -(-lo // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    for a in range(first, hi - HUGE_PAGE_BYTES + 1, HUGE_PAGE_BYTES):
      if _libc.mincore(a, HUGE_PAGE_BYTES, vec) != 0 or sum(b & 1 for b in vec) < need:
        continue
      if _libc.madvise(a, HUGE_PAGE_BYTES, MADV_COLLAPSE) == 0:
        moved += HUGE_PAGE_BYTES
  return moved


def _fresh_namespace():
  return {"__name__": "__main__", "__builtins__": builtins}


# ---------------------------------------------------------------------------------------------
# child setup
def _close_fds_except(keep):
  keep = sorted(set(keep))
  lo = 0
  for k in keep:
    if k > lo:
      os.closerange(lo, k)
    lo = k + 1
  os.closerange(lo, 65536)


def _drop_to_user(cfg, uid, scratch, cpu_s, parent=None):
  """``parent``: getppid() as the call's process first saw it; a different one now means that
  parent died before the death signal below was armed, and the call must not run."""
  lim = cfg["limits"]
  rl = resource
  rl.setrlimit(rl.RLIMIT_CORE, (0, 0))
  rl.setrlimit(rl.RLIMIT_CPU, (cpu_s, cpu_s + 1))
  rl.setrlimit(rl.RLIMIT_AS, (cfg["as_limit"], cfg["as_limit"]))
  rl.setrlimit(rl.RLIMIT_NOFILE, (lim["max_open_files"], lim["max_open_files"]))
  rl.setrlimit(rl.RLIMIT_FSIZE, (lim["max_output_bytes"] + 1, lim["max_output_bytes"] + 1))
  if cfg["drop_uid"]:
    rl.setrlimit(rl.RLIMIT_NPROC, (lim["max_procs"], lim["max_procs"]))
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
  else:
    try:
      rl.setrlimit(rl.RLIMIT_NPROC, (lim["max_procs"], lim["max_procs"]))
    except (ValueError, OSError):
      pass
  # The uid switch cleared any death signal: die with the template (or the call's init).
  _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  if parent is not None and os.getppid() != parent:
    # Killed between fork and here (seen under load at `uid`, where no PID namespace ends the
    # call with its parent): an orphan running as a sandbox uid would outlive its pool.
    os._exit(1)
  _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
  if cfg["seccomp"] is not None:
    install_seccomp(cfg["seccomp"])
  os.chdir(scratch)
  if not cfg.get("call_env_set"):  # rlimits level: the scratch dir differs per call
    _set_call_env(cfg, scratch)


def _set_call_env(cfg, home):
  os.environ.clear()
  os.environ.update(cfg["user_env"])
  os.environ["HOME"] = home
  os.environ["TMPDIR"] = home
  os.environ["PWD"] = home


def _wait_as_init(user_pid):
  """Reaps every child (we may be PID 1) until `user_pid` exits; returns its encoded status."""
  while True:
    try:
      pid, status = os.waitpid(-1, 0)
    except ChildProcessError:
      return 1
    except InterruptedError:
      continue
    if pid == user_pid:
      if os.WIFEXITED(status):
        return min(os.WEXITSTATUS(status), 127)
      return 128 + os.WTERMSIG(status)


# The signals a call gets back at their default action, as plain ints for `_signal.signal`
# (the C function): `signal.signal` turns its return value into an enum member through the
# pure-Python Enum machinery, ~20 us and ~5 copy-on-write faults per signal in a fresh child.
_CALL_DEFAULT_SIGNALS = tuple(
  int(s) for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ)
)
_SIG_DFL = int(signal.SIG_DFL)


def _child_main(cfg, job, fds):
  """The call's process (or its leader when there is no `sleep` to be PID 1): never returns."""
  # First, before anything that takes time: a parent that dies from here until _drop_to_user
  # re-arms the death signal (a uid switch clears it) kills this process or is noticed there.
  _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  job["parent"] = os.getppid()
  code = 1
  if job.get("cg"):
    join_cgroup(job["cg"], fds["err"])  # first: every page the call charges is its slot's
  try:
    signal.set_wakeup_fd(-1)  # the template's SIGCHLD wakeup pipe is not ours to write
    os.setsid()
    for sig in _CALL_DEFAULT_SIGNALS:
      _signal.signal(sig, _SIG_DFL)
    if cfg["call_ns"]:
      # Own network (loopback down, nothing else) and IPC namespaces: no socket, abstract
      # socket or SysV object is shared with a concurrent call, and all die with the call.
      if _libc.unshare(CLONE_NEWNET | CLONE_NEWIPC) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET|CLONE_NEWIPC) failed")
    if job["scratch"] is None:
      job["home"] = _mount_private_scratch(cfg, job["uid"])
    os.dup2(fds["in"], 0)
    os.dup2(fds["out"], 1)
    os.dup2(fds["err"], 2)
    os.dup2(fds["code"], 3)
    _close_fds_except([0, 1, 2, 3])
    if job.get("leader"):
      leader = os.getpid()
      user_pid = os.fork()
      if user_pid:
        os._exit(_wait_as_init(user_pid))
      job["parent"] = leader  # same PID namespace as its child: getppid() reads this pid
    _user_main(cfg, job)
  except BaseException:
    try:
      os.write(2, traceback.format_exc().encode())
    except BaseException:
      pass
  os._exit(code)


def _mount_private_scratch(cfg, uid):
  """In a mount namespace of the call's own: a fresh tmpfs (size- and inode-limited, owned by
  the call's uid, mode 700) at the scratch root, bound over every shared writable directory.
  The namespace is the template's (`Template._fork` made it for this call alone and forked
  this process into it); the template drops its last reference once every process of the call
  is gone (`MountNamespaceReaper`), so nobody walks or deletes what the call made, and no other
  call can enter or fill it. Returns the call's home."""
  # Handles taken in the call's own namespace (a bind source must belong to it).
  keeps = [(p, os.open(p, os.O_PATH | os.O_CLOEXEC)) for p in cfg.get("tmp_keeps", ())]
  size = cfg["limits"]["scratch_bytes"]
  opts = b"size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d" % (
    size,
    max(4096, size >> 12),  # one per page: the inodes' kernel memory stays small
    uid,
    uid,
  )
  root = cfg["scratch_root"].encode()
  if _libc.mount(b"tmpfs", root, b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
    raise OSError(ctypes.get_errno(), f"mount tmpfs on {cfg['scratch_root']} failed")
  os.chdir(root)
  home = cfg["scratch_root"]
  for d in cfg["shared_tmp_dirs"]:
    if _libc.mount(b".", d.encode(), None, MS_BIND, None) != 0:
      raise OSError(ctypes.get_errno(), f"bind the call's scratch over {d} failed")
    if d == "/tmp":
      home = "/tmp"
  # What the call imports from (the interpreter, this package, extra binds) may live under a
  # directory the scratch now covers (a checkout in /tmp): bound back read-only, then the
  # handles on it are closed so the call holds none.
  for path, fd in keeps:
    os.makedirs(path, mode=0o755, exist_ok=True)
    target = path.encode()
    if _libc.mount(f"/proc/self/fd/{fd}".encode(), target, None, MS_BIND | MS_REC, None) != 0:
      raise OSError(ctypes.get_errno(), f"bind {path} back over the call's scratch failed")
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
    if _libc.mount(None, target, None, flags, None) != 0:
      raise OSError(ctypes.get_errno(), f"remount {path} read-only failed")
    os.close(fd)
  return home


def _under(paths, covered):
  """The ``paths`` that lie under one of the ``covered`` directories (and exist)."""
  return [
    p for p in paths if any(p == d or p.startswith(d + "/") for d in covered) and os.path.exists(p)
  ]


def _user_main(cfg, job):
  _drop_to_user(cfg, job["uid"], job.get("home") or job["scratch"], job["cpu_s"], job.get("parent"))
  if _PREBUILT_STREAMS is not None:
    sys.stdin, sys.stdout, sys.stderr = _PREBUILT_STREAMS
  else:
    _new_std_streams()
  kind = job["kind"]
  if kind in ("exec", "func"):
    data = os.pread(3, os.fstat(3).st_size, 0)  # the host wrote it; only this process reads it
    os.close(3)
  if kind == "exec":
    rc = exec_user_code(data.decode("utf-8", "surrogatepass"), _fresh_namespace())
    _flush_std()
    os._exit(rc)
  if kind == "func":
    _run_function(job, data)
  if kind == "session":
    _session_loop()
  os._exit(2)


def _run_function(job, payload):
  """Unpickles (fn, args, kwargs) from the host, runs it, writes a `wire` record to fd 1.

  The host wrote the pickle (trusted direction); the result travels back as plain values only,
  so nothing this process writes is ever unpickled by the host.
  """
  import pickle

  for p in job.get("sys_path", ()):
    if p not in sys.path:
      sys.path.append(p)
  out = os.fdopen(os.dup(1), "wb")
  sys.stdout = sys.stderr  # prints of the function must not corrupt the result record
  try:
    fn, args, kwargs = pickle.loads(payload)
    del payload
    record = [True, fn(*args, **kwargs)]
  except BaseException as e:
    record = [False, "".join(traceback.format_exception(type(e), e, e.__traceback__))]
  try:
    data = wire.encode(record)
  except BaseException as e:
    data = wire.encode([False, f"result is not a plain value: {e}"])
  out.write(data)
  out.flush()
  _flush_std()
  os._exit(0)


def _join_threads():
  import threading

  for t in threading.enumerate():
    if t is not threading.main_thread() and not t.daemon:
      t.join()
  # A finished thread may still be leaving the kernel: give it a moment before the template looks.
  for _ in range(200):
    if len(os.listdir("/proc/self/task")) <= 1:
      break
    time.sleep(0.0005)


SESSION_DONE_OK, SESSION_DONE_ERR = signal.SIGUSR1, signal.SIGUSR2
_SESSION_MARKS = (SESSION_DONE_OK, SESSION_DONE_ERR)


def _session_loop():
  """Persistent interpreter. Between calls it is stopped (SIGSTOP); fd 3 holds the code of the
  next call when the template resumes it. The end of a call is the stop; whether the code
  failed is a blocked signal left pending (SESSION_DONE_OK / _ERR), which the template reads
  from the kernel's account of the stopped process. Nothing the call writes says either."""
  import _thread

  namespace = _fresh_namespace()
  rc = None
  # Blocked before any user code, so the threads it starts inherit the block; the mark is
  # sent to this thread (the one /proc/<pid>/status describes), not to the process.
  signal.pthread_sigmask(signal.SIG_BLOCK, _SESSION_MARKS)
  me = _thread.get_ident()
  while True:
    if rc is not None:
      signal.pthread_sigmask(signal.SIG_BLOCK, _SESSION_MARKS)  # the user code may unblock them
      signal.pthread_kill(me, SESSION_DONE_OK if rc == 0 else SESSION_DONE_ERR)
    os.kill(os.getpid(), signal.SIGSTOP)
    while signal.sigtimedwait(_SESSION_MARKS, 0) is not None:  # the last call's mark
      pass
    try:
      size = os.fstat(3).st_size
      code = os.pread(3, size, 0).decode("utf-8", "surrogatepass")
    except BaseException:
      os._exit(3)
    _new_std_streams()  # the template rewound and truncated the memfds, start from clean buffers
    rc = exec_user_code(code, namespace)
    try:
      _join_threads()  # like the end of a script: non-daemon threads finish within the call
    except BaseException:
      pass
    _flush_std()
    try:
      os.fstat(3)  # the next call's code arrives there: a call that broke it ends the session
    except OSError:
      os._exit(3)


# ---------------------------------------------------------------------------------------------
# cgroups: each call (and each session, for its lifetime) runs in a memory + pids cgroup of its
# own, a child of the directory the host created for this template and passed as an fd.
class CgroupSlots:
  """Reusable per-call cgroups under the host's delegated directories (v1: one per controller;
  v2: one). A slot is taken by a call or a session and given back once its processes are gone;
  its limits are set once, its counters are read relative to their value when taken. What the
  call's process writes never enters here: the limits are the kernel's, the counters too."""

  def __init__(self, spec, memory_bytes, max_procs):
    self.version = spec["version"]
    self.dirs = spec["fds"]  # controller ("memory", "pids"; v2: "unified") -> directory fd
    self.memory_bytes = memory_bytes
    self.max_procs = max_procs
    self.free = []
    self.all = []
    self.serial = 0
    # Slots whose last call's mount namespace (its tmpfs, charged to the slot) is still being
    # released by the reaper, by key: reused only once the reaper says it is gone.
    self.pending = {}

  def _open(self, ctl, name, path, flags):
    return os.open(f"{name}/{path}", flags | os.O_CLOEXEC, dir_fd=self.dirs[ctl])

  def _write(self, ctl, name, path, value, missing_ok=False):
    try:
      fd = self._open(ctl, name, path, os.O_WRONLY)
    except FileNotFoundError:
      if missing_ok:
        return
      raise
    try:
      os.write(fd, str(value).encode())
    finally:
      os.close(fd)

  def _make(self):
    self.serial += 1
    name = f"c{self.serial}"
    slot = {"name": name, "procs": [], "made": []}
    try:
      for ctl in self.dirs:
        os.mkdir(name, 0o755, dir_fd=self.dirs[ctl])
        slot["made"].append(ctl)
      if self.version == 1:
        self._write("memory", name, "memory.limit_in_bytes", self.memory_bytes)
        # With swap, memory.limit_in_bytes alone would let anonymous pages spill into it.
        self._write("memory", name, "memory.memsw.limit_in_bytes", self.memory_bytes, True)
        self._write("pids", name, "pids.max", self.max_procs)
        # `tasks`, not `cgroup.procs`: the call's process is single-threaded when it joins
        # (a fork's child), so moving its one thread moves the process, and the kernel moves a
        # single thread writing `0` about itself without write-locking the global
        # cgroup_threadgroup_rwsem. Through `cgroup.procs` every join takes that lock, which
        # first waits an RCU grace period whenever no migration ran in the last one, holding
        # the global cgroup_mutex meanwhile, so concurrent calls' joins and the templates'
        # forks queued behind it (off-CPU time: same CPU per call, lower calls/s).
        slot["procs"] = [self._open(c, name, "tasks", os.O_WRONLY) for c in self.dirs]
        slot["failcnt"] = self._open("memory", name, "memory.failcnt", os.O_RDWR)
        slot["events"] = self._open("memory", name, "memory.oom_control", os.O_RDONLY)
        slot["current"] = self._open("pids", name, "pids.current", os.O_RDONLY)
      else:
        self._write("unified", name, "memory.max", self.memory_bytes)
        self._write("unified", name, "memory.swap.max", 0, True)
        self._write("unified", name, "pids.max", self.max_procs)
        slot["procs"] = [self._open("unified", name, "cgroup.procs", os.O_WRONLY)]
        slot["events"] = self._open("unified", name, "memory.events", os.O_RDONLY)
        slot["current"] = self._open("unified", name, "pids.current", os.O_RDONLY)
    except BaseException:
      self._remove(slot)
      raise
    self.all.append(slot)
    return slot

  @staticmethod
  def _counts(fd):
    """The `key value` lines of memory.oom_control (v1) or memory.events (v2) as a dict."""
    out = {}
    for line in os.pread(fd, 4096, 0).decode().splitlines():
      k, _, v = line.partition(" ")
      if v.strip().isdigit():
        out[k] = int(v)
    return out

  def take(self):
    # A slot given back still holds the killed processes the kernel has not released yet
    # (orphans reparented outside the template are reaped by their new parent, later): their
    # pids still count against pids.max, so a call given that slot could not fork. Only an
    # empty slot is reused; a busy one waits in the free list until it empties.
    for i in range(len(self.free) - 1, -1, -1):
      if self._empty(self.free[i]):
        slot = self.free.pop(i)
        break
    else:
      slot = self._make()
    self.rebase(slot)
    return slot

  @staticmethod
  def _empty(slot):
    try:
      return os.pread(slot["current"], 32, 0).strip() == b"0"
    except OSError:
      return False

  def rebase(self, slot):
    """Counters from here on are the next call's (a session keeps its slot across calls)."""
    if self.version == 1 and os.pread(slot["failcnt"], 32, 0).strip() != b"0":
      os.pwrite(slot["failcnt"], b"0", 0)
    slot["base"] = self._counts(slot["events"])

  def hit_limit(self, slot):
    """Whether the slot's memory reached its limit since it was taken (the kernel's counters:
    v1 failcnt or an OOM kill; v2 a `max` or `oom_kill` event)."""
    now, base = self._counts(slot["events"]), slot["base"]
    if self.version == 1:
      failed = os.pread(slot["failcnt"], 32, 0).strip() not in (b"0", b"")
      return failed or now.get("oom_kill", 0) > base.get("oom_kill", 0)
    return any(now.get(k, 0) > base.get(k, 0) for k in ("max", "oom_kill"))

  def give(self, slot, pending=None):
    """Back to the free list once its processes are gone; with a `pending` key, only once
    `released(key)` says its last call's mount namespace is gone too (the tmpfs pages it holds
    are charged to the slot: the next call must not start with them)."""
    if pending is not None:
      self.pending[pending] = slot
    else:
      self.free.append(slot)

  def released(self, key):
    slot = self.pending.pop(key, None)
    if slot is not None:
      self.free.append(slot)

  def _remove(self, slot):
    for fd in slot["procs"] + [slot[k] for k in ("failcnt", "events", "current") if k in slot]:
      try:
        os.close(fd)
      except OSError:
        pass
    for ctl in slot["made"]:
      try:
        os.rmdir(slot["name"], dir_fd=self.dirs[ctl])
      except OSError:
        pass  # still busy (a process not yet reaped): the host removes the tree after us

  def close(self):
    for slot in self.all:
      self._remove(slot)
    self.all, self.free, self.pending = [], [], {}


# ---------------------------------------------------------------------------------------------
# mount namespaces: dropped off the calls' exit path
_NS_KEY = struct.Struct("<Q")
_NS_MSG = struct.Struct("<QBB")  # key, hold (1, with the descriptor) or release (0), ack
# Threads of the reaper, each with a socket of its own (a call's `hold` and `release` go to the
# same one, in order): that many teardowns wait for (and share) a grace period at once.
MNTNS_REAPER_THREADS = 2
MNTNS_REAPER_NAME = b"mntns_reaper"  # its comm (the cmdline is the template's)


class MountNamespaceReaper:
  """The template's helper process that drops the last reference to each finished call's mount
  namespace.

  When a mount namespace's last reference goes, the kernel unmounts its tree and, before
  freeing the mounts, waits an expedited RCU grace period (namespace_unlock ->
  synchronize_rcu_expedited). Held by the call's process alone, that wait ran in its exit,
  before the exit was reported (a pidfd turns readable at the end of do_exit): off-CPU time in
  every call (rstar_jax/tools/README.md has the figures). So the template makes each call's
  namespace itself (`Template._fork`) and, right after the fork, sends a descriptor of it here
  (`hold`) and closes its own: while the call runs, this process holds the one reference besides
  the call's processes, so the call's exit drops only its own. Once every process of the call
  is gone the template says so (`release`), a worker thread here closes the descriptor (the
  teardown and its grace period are waited here, several at once) and writes the key back
  (`acks`): the call's cgroup slot, to whose memory cgroup the call's tmpfs pages are charged,
  is reused only once they are freed. Each thread reads a socket of its own (call `key` uses
  socket `key % threads`): no hand-off between threads, whose cost (futex wake-ups, the GIL
  passed back and forth: ~14 futex calls a call with one reader feeding four workers) would
  be paid per call.

  It never runs user code: forked by the template before the preloads, it closes every other
  descriptor, drops every capability and dies with the template. A namespace it cannot take
  (its queue full) is left to the call's exit, as before it existed. It is not expected to die
  (no user code reaches it); if it does, the kernel closes what it held, the template goes on
  without it (each call's exit waits for its own teardown again) and never reuses the slots
  whose release it did not acknowledge (no guess at when their namespaces went)."""

  def __init__(self, threads=MNTNS_REAPER_THREADS):
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(threads)]
    ack_r, ack_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
      for mine, _ in pairs:
        mine.close()
      _mntns_reaper_main([theirs.detach() for _, theirs in pairs], ack_w)
    for mine, theirs in pairs:
      theirs.close()
      mine.set_inheritable(False)
    os.close(ack_w)
    self.socks, self.ack_r, self.pid = [mine for mine, _ in pairs], ack_r, pid
    self.pidfd = os.pidfd_open(pid)  # readable when it exits: the template's loop reaps it
    os.set_blocking(ack_r, False)
    self.serial = 0
    self.gone = False
    self.unsent = collections.deque()

  def hold(self, nsfd):
    """Hands namespace descriptor `nsfd` to the reaper, closing it here (never the last
    reference: the reaper's, in flight or received, outlives it). Its key, or None where the
    reaper cannot take it (then the call's processes hold it alone, as before the reaper)."""
    if self.gone:
      os.close(nsfd)
      return None
    self.serial += 1
    try:
      self.socks[self.serial % len(self.socks)].sendmsg(
        [_NS_MSG.pack(self.serial, 1, 0)],
        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", nsfd))],
        socket.MSG_DONTWAIT,
      )
    except OSError as e:
      # Called right after a fork: never raises (the new process must be tracked first). Only
      # a closed peer means the reaper is gone; a full queue or any other refusal (too many
      # descriptors in flight) leaves this one namespace to its call.
      self._lost(e, isinstance(e, ConnectionError))
      return None
    finally:
      os.close(nsfd)
    return self.serial

  def _lost(self, why, gone=True):
    if gone and not self.gone:
      self.gone = True
      os.write(2, f"[code_pool template] mount namespace reaper gone ({why})\n".encode())

  def release(self, key, ack):
    """Every process of call `key` is gone: the reaper drops its namespace, then (with `ack`)
    writes `key` back. Where the reaper is gone, the kernel closed what it held, at an unknown
    time: the key is never acknowledged."""
    if not self.gone:
      self.unsent.append((key, _NS_MSG.pack(key, 0, ack)))
      self.flush()

  def flush(self):
    """Sends the releases not sent yet. Never blocks: a reaper that stopped reading must not
    stall the template (the template's loop retries while any is left)."""
    while self.unsent and not self.gone:
      key, msg = self.unsent[0]
      try:
        self.socks[key % len(self.socks)].send(msg, socket.MSG_DONTWAIT)
      except OSError as e:  # full, or refused for now: retried by the template's loop
        self._lost(e, isinstance(e, ConnectionError))
        return
      self.unsent.popleft()

  def reap(self):
    """Its pidfd turned readable: True once reaped (gone for good; its pidfd is the caller's
    to unregister and close)."""
    if os.waitpid(self.pid, os.WNOHANG)[0] == 0:
      return False
    self._lost("exited")
    return True

  def acks(self):
    """Keys of the namespaces dropped since the last look (non-blocking)."""
    out = []
    while True:
      try:
        b = os.read(self.ack_r, 8 * 512)
      except BlockingIOError:
        return out
      if not b:
        self._lost("its pipe closed")
        return out
      out += [k for (k,) in _NS_KEY.iter_unpack(b)]


def _drop_all_capabilities():
  hdr, data = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3
  if _libc.capset(ctypes.byref(hdr), data) != 0:
    raise OSError(ctypes.get_errno(), "capset failed")


def _mntns_reaper_main(sock_fds, ack_fd):
  """The reaper process (see MountNamespaceReaper): never returns. One thread per socket, each
  taking its calls' messages in order (a `hold` always before its `release`) and closing the
  released descriptors itself."""
  try:
    _close_fds_except([2, ack_fd, *sock_fds])
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:
      os._exit(0)
    _libc.prctl(PR_SET_NAME, MNTNS_REAPER_NAME, 0, 0, 0)
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _drop_all_capabilities()  # closing a descriptor needs none
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # one per running call or session
    import threading

    def serve(sock_fd):
      sock, held = socket.socket(fileno=sock_fd), {}
      while True:
        msg, fds = _recv_fds_cloexec(sock, 1)
        if not msg and not fds:  # the template is gone
          os._exit(0)
        key, hold, ack = _NS_MSG.unpack(msg)
        if hold:
          # No descriptor: the kernel could not install it here (descriptors exhausted) and
          # dropped it; the call's processes held the namespace alone and their exit freed it.
          held[key] = fds[0] if fds else None
          for fd in fds[1:]:
            os.close(fd)
          continue
        fd = held.pop(key, None)
        if fd is not None:
          os.close(fd)  # the namespace's teardown and its grace period: waited here
        if ack:
          os.write(ack_fd, _NS_KEY.pack(key))  # <= PIPE_BUF: atomic between the threads

    for fd in sock_fds[1:]:
      threading.Thread(target=serve, args=(fd,), daemon=True).start()
    serve(sock_fds[0])
  except BaseException:
    try:
      os.write(2, f"[code_pool template] mount namespace reaper: {traceback.format_exc()}".encode())
    except BaseException:
      pass
  os._exit(1)


def join_cgroup(fds, err_fd):
  """In the call's process, before anything of the call's runs: move itself into its slot
  (``0`` is the writer itself; the process has one thread here, see CgroupSlots._make). A
  failure ends the process before any user code."""
  for fd in fds:
    try:
      os.write(fd, b"0")
    except OSError as e:
      try:
        os.write(err_fd, f"sandbox: could not join the call's cgroup: {e}\n".encode())
      finally:
        os._exit(1)


# ---------------------------------------------------------------------------------------------
# template
_REQ_FIELDS = {
  # A call's code, stdin, arguments and output never travel here: they are in the memfds the
  # host passes with the request (CALL_FDS, over the fd socket), read and written only by the
  # host and the call's process.
  "exec": {"rid": int, "timeout_s": float},
  "func": {"rid": int, "timeout_s": float, "sys_path": list},
  "session": {"rid": int, "timeout_s": float, "session_id": str},
  "close_session": {"rid": int, "session_id": str},
  "abort_session": {"rid": int, "session_id": str},
  "ping": {"rid": int},
  "shutdown": {},
}


# The memfds the host sends with each exec/func/session request, in this order.
CALL_FDS = ("in", "code", "out", "err")
_RID = struct.Struct("<Q")


def check_request(req):
  if type(req) is not dict or req.get("kind") not in _REQ_FIELDS:
    raise wire.WireError(f"unknown request {type(req).__name__}")
  wire.check_record(req, _REQ_FIELDS[req["kind"]], f"request {req['kind']}")
  t = req.get("timeout_s")
  if t is not None and not (0.0 < t <= MAX_TIMEOUT_S):  # also false for NaN
    raise wire.WireError(f"timeout_s must be in (0, {MAX_TIMEOUT_S}], got {t!r}")
  return req


def _recv_fds_cloexec(sock, maxfds):
  """(message, fds) of one SCM_RIGHTS message, the fds close-on-exec from the moment they
  arrive (MSG_CMSG_CLOEXEC), so nothing the template execs (a session's PID 1) inherits a
  call's memfds. (`socket.recv_fds` drops its `flags` argument.)"""
  msg, anc, _, _ = sock.recvmsg(64, socket.CMSG_LEN(maxfds * 4), socket.MSG_CMSG_CLOEXEC)
  fds = []
  for level, kind, data in anc:
    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
      fds += [int.from_bytes(data[i : i + 4], sys.byteorder) for i in range(0, len(data) - 3, 4)]
  return msg, fds


class _Poller:
  """epoll with one payload per fd (the template's hot loop: no `selectors` key objects).
  The payloads of a batch are taken when it is polled, so a handler that unregisters or
  reuses an fd number cannot redirect a later event of the same batch."""

  def __init__(self):
    self.ep = select.epoll()
    self.data = {}

  def register(self, fd, data):
    self.ep.register(fd, select.EPOLLIN)
    self.data[fd] = data

  def unregister(self, fd):
    self.ep.unregister(fd)
    del self.data[fd]

  def poll(self, timeout):
    events = self.ep.poll(-1 if timeout is None else timeout)  # EINTR: retried by Python
    return [self.data[fd] for fd, _ in events if fd in self.data]


class Template:
  def __init__(self, cfg, ctl_in, ctl_out, reaper=None):
    self.cfg = cfg
    self.ctl_in = ctl_in
    self.ctl_out = ctl_out
    self.lim = cfg["limits"]
    # FIFO: a released uid goes to the back, so the next call gets the least recently used one.
    self.free_uids = collections.deque(range(cfg["uid_lo"], cfg["uid_hi"]))
    self.calls = {}  # pidfd -> call record (exec/func)
    self.sessions = {}  # session_id -> session record
    self.dying = {}  # pidfd -> record of a closed session not yet reaped
    self.sel = _Poller()
    self.buf = bytearray()
    self.fd_sock = socket.socket(fileno=cfg["fd_sock"])
    self.fd_sock.set_inheritable(False)  # not into the posix_spawn'ed PID 1s
    self.fd_sock.setblocking(False)
    self.pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY) if cfg["pidns"] else None
    # Root levels: each call's scratch lives in a mount namespace the template makes for it
    # (see _fork); this is the way back into the template's own.
    self.reaper = reaper
    self.mntns_fd = None
    if cfg["private_scratch"]:
      self.mntns_fd = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
      os.chdir("/")  # where each return to this namespace (setns) leaves the template anyway
    # PID 1 of each call's namespace: a tiny exec'd process (cheaper than forking this big
    # interpreter twice). Orphans re-parent to it; killing it tears the namespace down.
    self.init_path = next((p for p in ("/usr/bin/sleep", "/bin/sleep") if os.path.exists(p)), None)
    self.reaping = {}  # init pidfd -> (init pid, uid, scratch) awaiting namespace teardown
    self.scratch_root = cfg["scratch_root"]
    os.makedirs(self.scratch_root, mode=0o711, exist_ok=True)
    os.chmod(self.scratch_root, 0o711)
    if not cfg["private_scratch"]:  # rlimits level: leftovers of a dead predecessor
      for name in os.listdir(self.scratch_root):
        wire.rmtree(os.path.join(self.scratch_root, name))
    self.serial = 0
    # Session processes report the end of a call by stopping: SIGCHLD wakes the poller.
    self.sig_r, self.sig_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    self.subreaper = not cfg["drop_uid"] and _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    signal.set_wakeup_fd(self.sig_w, warn_on_full_buffer=False)
    self._sigchld_on = None
    self._watch_children()
    self.cg = None
    for fd in (cfg.get("cgroup") or {}).get("fds", {}).values():
      os.set_inheritable(fd, False)  # passed by the host; not for a session's exec'd PID 1
    if cfg.get("cgroup"):
      self.cg = CgroupSlots(
        cfg["cgroup"], cfg["limits"]["memory_limit_mb"] << 20, cfg["limits"]["max_procs"]
      )

  def _watch_children(self, force=False):
    """SIGCHLD wakes the loop only while someone needs it: sessions (they report a call's end
    by stopping) and the rlimits level's orphan sweep. A plain call's end comes from its
    pidfd, so without sessions its exit costs no signal delivery, handler run or extra wakeup."""
    want = bool(self.sessions) or self.subreaper or force
    if want != self._sigchld_on:
      # SIG_DFL, not SIG_IGN: ignoring SIGCHLD would make the kernel reap our children.
      signal.signal(signal.SIGCHLD, (lambda *_: None) if want else signal.SIG_DFL)
      self._sigchld_on = want

  # -- resources
  def _alloc_uid(self):
    if not self.free_uids:
      raise RuntimeError("no free sandbox uid (too many concurrent calls and sessions)")
    return self.free_uids.popleft()

  def _kill_uid(self, uid):
    """Without PID namespaces: SIGKILL every process running as `uid` (setsid escapees too)."""
    if self.cfg["pidns"] or not self.cfg["drop_uid"]:
      return
    pid = os.fork()
    if pid == 0:
      try:
        os.setgid(uid)
        os.setuid(uid)
        for _ in range(1000):  # a fork bomb may race the kill; repeat until nothing is left
          try:
            os.kill(-1, signal.SIGKILL)
          except ProcessLookupError:
            break
      finally:
        os._exit(0)
    os.waitpid(pid, 0)

  def _kill_group_and_uid(self, pgid, uid):
    try:
      os.killpg(pgid, signal.SIGKILL)
    except OSError:
      pass
    self._kill_uid(uid)

  def _make_scratch(self, uid):
    """A host directory for the call's files, or None when the call mounts its own tmpfs
    (every root level: nothing of the call's is ever walked or deleted by the template)."""
    if self.cfg["private_scratch"]:
      return None
    self.serial += 1
    path = os.path.join(self.scratch_root, f"s{uid}_{os.getpid()}_{self.serial}")
    os.mkdir(path, 0o700)
    try:
      if self.cfg["drop_uid"]:
        os.chown(path, uid, uid)
    except BaseException:
      wire.rmtree(path)
      raise
    return path

  def _release(self, uid, scratch, pgid=None, cg=None, mntns_key=None):
    pending = None
    try:
      if pgid is not None and not self.cfg["pidns"]:
        try:
          os.killpg(pgid, signal.SIGKILL)  # background children left in the call's group
        except OSError:
          pass
      self._kill_uid(uid)
      if scratch is not None:  # rlimits level: the call ran as our own uid, nothing gained
        wire.rmtree(scratch)
    finally:
      self.free_uids.append(uid)
      if mntns_key is not None:  # every process of the call is gone: its namespace can go
        self.reaper.release(mntns_key, cg is not None)
        pending = mntns_key  # acknowledged by the reaper, or never (then never reused)
      if cg is not None:  # the slot is empty again (once its namespace is gone, if pending)
        self.cg.give(cg, pending=pending)
    self.sweep_orphans()

  def _take_slot(self):
    if self.cg.pending and self.reaper is not None:
      for key in self.reaper.acks():
        self.cg.released(key)
    return self.cg.take()

  def sweep_orphans(self):
    """Without a uid or PID namespace to kill by (the rlimits level), the template is its
    calls' child subreaper: a process that left its call (setsid, double fork) is re-parented
    here when its parent exits. Every child that is no call or session is such an escapee:
    killed with its group and reaped, generation by generation (its own children re-parent
    here in turn)."""
    if not self.subreaper:
      return
    for _ in range(1000):
      # Closed sessions not reaped yet are ours too: reaped here, their pidfd's event would
      # find no child to wait for (it made the template exit: a rare restart at rlimits).
      known = {c["pid"] for c in self.calls.values()} | {
        s["pid"] for group in (self.sessions, self.dying) for s in group.values()
      }
      strays = set()
      try:
        for tid in os.listdir("/proc/self/task"):
          with open(f"/proc/self/task/{tid}/children") as f:
            strays.update(int(p) for p in f.read().split())
      except OSError:
        return
      strays -= known
      if not strays:
        return
      for pid in strays:  # our unreaped child: its pid (and group id) cannot be reused meanwhile
        for kill in (os.killpg, os.kill):
          try:
            kill(pid, signal.SIGKILL)
          except OSError:
            pass
      for pid in strays:
        try:
          os.waitpid(pid, 0)
        except ChildProcessError:
          pass

  # -- fork
  @staticmethod
  def _kill_reap(pid):
    """SIGKILL and reap a child we just made (its pid cannot be reused before the reap)."""
    try:
      os.kill(pid, signal.SIGKILL)
    except OSError:
      pass
    try:
      os.waitpid(pid, 0)
    except ChildProcessError:
      pass

  def _fork(self, job, fds):
    """Starts the call's process; returns (pid, pidfd, init, mntns_key): init = (pid, pidfd)
    or None, mntns_key the reaper's key for the call's own mount namespace or None. Every
    process made here is tracked by a pidfd before anything else can fail, and if
    anything does (descriptors exhausted), whatever was made is killed and reaped: a failed
    start leaves nothing behind."""
    flags = 0
    if self.cfg["pidns"]:
      # A second unshare(CLONE_NEWPID) fails with EINVAL unless we first return to our own ns.
      if _libc.setns(self.pidns_fd, CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "setns(CLONE_NEWPID) failed")
      flags |= CLONE_NEWPID
    if job["scratch"] is None:
      # The call's private scratch gets a mount namespace of its own, made here rather than in
      # the call's process: the template holds a reference from the start (nothing of the
      # call's involved), so the call's exit never drops the last one and never waits for the
      # teardown's RCU grace period (see MountNamespaceReaper). The template steps into the new
      # namespace only to fork, and straight back.
      flags |= CLONE_NEWNS
    if flags and _libc.unshare(flags) != 0:
      raise OSError(ctypes.get_errno(), f"unshare({flags:#x}) for the call failed")
    if not flags & CLONE_NEWNS:
      pid, pidfd, init = self._fork_in_place(job, fds)
      return pid, pidfd, init, None
    try:
      mntns = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except BaseException:
      self._back_to_own_mntns()
      raise
    try:
      pid, pidfd, init = self._fork_in_place(job, fds)
    except BaseException:
      self._back_to_own_mntns()
      os.close(mntns)  # nothing of the call's left in it (rare path: its teardown waits here)
      raise
    self._back_to_own_mntns()
    if self.reaper is None:
      os.close(mntns)  # the call's processes hold it alone: its exit waits for the teardown
      return pid, pidfd, init, None
    return pid, pidfd, init, self.reaper.hold(mntns)

  def _back_to_own_mntns(self):
    if _libc.setns(self.mntns_fd, CLONE_NEWNS) != 0:
      # Left in a call's namespace, the next call's would be a copy of it (with this call's
      # scratch): nothing may run on. The host restarts the template.
      os.write(2, f"[code_pool template] setns back failed: errno {ctypes.get_errno()}\n".encode())
      os._exit(70)

  def _fork_in_place(self, job, fds):
    """Forks the call's process (and its PID 1) in the namespaces the template is in now."""
    init = None
    if self.cfg["pidns"]:
      if job["kind"] != "session" and not self.cfg["allow_subprocesses"]:
        # One process (the filter refuses fork): the call itself is PID 1 of its namespace.
        # Nothing can be orphaned into it, and its exit ends the namespace, so a separate init
        # (a `sleep` exec per call: ~8% of a trivial call's CPU) buys nothing. Sessions keep
        # one: a namespace's PID 1 cannot SIGSTOP itself.
        pass
      elif self.init_path:
        # The first child becomes PID 1 of the new namespace; our next fork joins it. It stays
        # in our process group (no setsid) so that killing the template's group kills it too,
        # and with it the whole namespace: no orphan survives a killed template.
        ipid = os.posix_spawn(self.init_path, [self.init_path, "infinity"], {})
        try:
          init = (ipid, os.pidfd_open(ipid))
        except BaseException:
          self._kill_reap(ipid)
          raise
      else:
        job["leader"] = True
    try:
      pid = os.fork()
    except BaseException:
      if init:
        self._stop_init(init, None, None)
      raise
    if pid == 0:
      _child_main(self.cfg, job, fds)
    try:
      pidfd = os.pidfd_open(pid)
    except BaseException:
      self._kill_reap(pid)
      if init:
        self._stop_init(init, None, None)
      raise
    return pid, pidfd, init

  def _stop_init(self, init, uid, scratch, cg=None, mntns_key=None):
    """Kills the call's PID 1 (so its whole namespace) and releases uid/scratch once reaped."""
    ipid, ipidfd = init
    try:
      signal.pidfd_send_signal(ipidfd, signal.SIGKILL)
    except ProcessLookupError:
      pass
    self.reaping[ipidfd] = (ipid, uid, scratch, cg, mntns_key)
    self.sel.register(ipidfd, ("init", ipidfd))

  def on_init_dead(self, ipidfd):
    entry = self.reaping.get(ipidfd)
    if entry is None:
      return
    ipid, uid, scratch, cg, mntns_key = entry
    if os.waitpid(ipid, os.WNOHANG)[0] == 0:
      return
    del self.reaping[ipidfd]
    self.sel.unregister(ipidfd)
    os.close(ipidfd)
    if uid is not None:
      self._release(uid, scratch, cg=cg, mntns_key=mntns_key)

  def _end(self, rec):
    """After the call's process exited: tear down what it started, then free its uid."""
    if rec.get("init"):
      self._stop_init(rec["init"], rec["uid"], rec["scratch"], rec.get("cg"), rec.get("mntns_key"))
    else:
      self._release(rec["uid"], rec["scratch"], rec["pid"], rec.get("cg"), rec.get("mntns_key"))

  def recv_call_fds(self, rid):
    """The memfds the host sent for request `rid` (sent before the request itself, so they are
    already queued). Messages of requests that never arrived (a failed write) are dropped."""
    while True:
      try:
        msg, fds = _recv_fds_cloexec(self.fd_sock, len(CALL_FDS) + 1)
      except BlockingIOError:
        raise RuntimeError(f"no memfds arrived with request {rid}") from None
      if len(msg) == _RID.size and _RID.unpack(msg)[0] == rid and len(fds) == len(CALL_FDS):
        return dict(zip(CALL_FDS, fds))
      for fd in fds:
        os.close(fd)
      if len(msg) == _RID.size and _RID.unpack(msg)[0] > rid:
        raise RuntimeError(f"no memfds arrived with request {rid}")

  def start_call(self, req, fds):
    kind = req["kind"]
    if kind == "session":
      return self.session_call(req, fds)
    t0 = time.monotonic()
    timeout = req["timeout_s"]
    taken = [("fds", list(fds.values()))]  # what to give back if anything below fails
    try:
      uid = self._alloc_uid()
      taken.append(("uid", uid))
      scratch = self._make_scratch(uid)
      taken.append(("scratch", scratch))
      cg = self._take_slot() if self.cg is not None else None
      taken.append(("cg", cg))
      job = {
        "kind": kind,
        "uid": uid,
        "scratch": scratch,
        "cpu_s": int(timeout) + 1,
        "sys_path": req.get("sys_path", ()),
        "cg": cg["procs"] if cg else None,
      }
      pid, pidfd, init, mntns_key = self._fork(job, fds)
    except BaseException:
      self._give_back(taken)
      raise
    out, err = fds["out"], fds["err"]
    os.close(fds["in"])
    os.close(fds["code"])
    call = {
      "rid": req["rid"],
      "kind": kind,
      "pid": pid,
      "pidfd": pidfd,
      "uid": uid,
      "scratch": scratch,
      "out": out,
      "err": err,
      "t0": t0,
      "init": init,
      "deadline": t0 + timeout,
      "killed": None,
      "cpu_s": job["cpu_s"],
      "cg": cg,
      "mntns_key": mntns_key,
    }
    self.calls[pidfd] = call
    self.sel.register(pidfd, ("call", pidfd))

  def _give_back(self, taken):
    d = dict(taken)
    for fd in d.get("fds", ()):
      os.close(fd)
    if "uid" in d:
      if "scratch" in d:
        self._release(d["uid"], d["scratch"], cg=d.get("cg"))
      else:
        self.free_uids.append(d["uid"])

  def _output_size(self, fd):
    """(bytes written, whether past the cap): the size only, the template never reads them."""
    size = os.fstat(fd).st_size
    return size, size > self.lim["max_output_bytes"]

  def _memory_grew(self, peak_rss_bytes):
    """Whether a call's kernel-accounted peak resident memory (which starts at the template's
    own, shared at fork) grew by MEMORY_OBSERVED_FRACTION of the limit or more."""
    try:
      with open("/proc/self/statm") as f:
        base = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
      base = 0
    limit = self.lim["memory_limit_mb"] << 20
    return peak_rss_bytes - base >= MEMORY_OBSERVED_FRACTION * limit

  @staticmethod
  def _cpu_limit_kill(sig, usage, soft_s):
    """Whether death by `sig` is the kernel's RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL
    at the hard one (soft + 1; a namespace's PID 1 ignores SIGXCPU), with the process's CPU
    account at that limit. A call that burns CPU in many threads and then kills itself with
    another signal, or with SIGKILL before the hard limit, gets its own ending, not `timeout`.
    (The kernel checks the limit against its tick-sampled user + system time, while the
    account `wait4` reports is the precise runtime: on a loaded machine the ticks can run ahead
    of it, so the account is allowed CPU_ACCOUNT_SLACK_S below the limit.)"""
    used = usage.ru_utime + usage.ru_stime
    if sig == signal.SIGXCPU:
      return used >= soft_s - CPU_ACCOUNT_SLACK_S
    return sig == signal.SIGKILL and used >= soft_s + 1 - CPU_ACCOUNT_SLACK_S

  @staticmethod
  def _classify(rc, killed, over, cpu_out=False, mem_out=False):
    """The status from what the template observed, never from what the call says: `killed`
    (its own kill), `over` (stdout/stderr bytes past the cap), `cpu_out` (the kernel's CPU
    account reached RLIMIT_CPU), `mem_out` (the kernel's peak-memory account). Any other
    ending, whatever its exit code, is `error` unless it exited 0."""
    if killed == "timeout" or (killed is None and cpu_out):
      return "timeout"
    if over:
      return "output_limit"
    if rc == 0 and killed is None:
      return "ok"
    return "memory_limit" if mem_out else "error"

  def finish_call(self, pidfd):
    call = self.calls.get(pidfd)
    if call is None:
      return
    # A stale event of this select batch may name a reused fd number: only reap real exits.
    pid, status, usage = os.wait4(call["pid"], os.WNOHANG)
    if pid == 0:
      return
    del self.calls[pidfd]
    self.sel.unregister(pidfd)
    os.close(pidfd)
    signaled = os.WIFSIGNALED(status)
    rc = 128 + os.WTERMSIG(status) if signaled else os.WEXITSTATUS(status)
    _, over_o = self._output_size(call["out"])
    n_err, over_e = self._output_size(call["err"])
    err = b""  # what the template adds after the call's own stderr (which the host reads)
    os.close(call["out"])
    os.close(call["err"])
    cpu_out = signaled and self._cpu_limit_kill(rc - 128, usage, call["cpu_s"])
    mem_out = rc != 0 and (
      (call["cg"] is not None and self.cg.hit_limit(call["cg"]))
      or self._memory_grew(usage.ru_maxrss * 1024)
    )
    self._end(call)
    status_s = self._classify(rc, call["killed"], over_o or over_e, cpu_out, mem_out)
    if signaled and status_s == "error":
      name = signal.Signals(rc - 128).name if rc - 128 in signal.valid_signals() else rc - 128
      err += f"\nProcess killed by signal {name}\n".encode()
    elif rc and status_s == "error" and not n_err:
      err += f"Process exited with code {rc}\n".encode()
    self.reply(
      call["rid"],
      {
        "status": status_s,
        "stdout": b"",
        "stderr": err,
        "exit_code": rc,
        "duration_s": time.monotonic() - call["t0"],
      },
    )

  # -- sessions
  def _start_session(self, sid, fds):
    if self.cfg["pidns"] and not self.init_path:
      raise RuntimeError("sessions need /usr/bin/sleep as their namespace's PID 1")
    taken = [("fds", list(fds.values()))]
    try:
      uid = self._alloc_uid()
      taken.append(("uid", uid))
      scratch = self._make_scratch(uid)
      taken.append(("scratch", scratch))
      cg = self._take_slot() if self.cg is not None else None
      taken.append(("cg", cg))
      out, err, inp, code_fd = fds["out"], fds["err"], fds["in"], fds["code"]
      job = {
        "kind": "session",
        "uid": uid,
        "scratch": scratch,
        "cpu_s": int(self.cfg["session_cpu_s"]),
        "cg": cg["procs"] if cg else None,
      }
      self._watch_children(force=True)  # before its first stop
      pid, pidfd, init, mntns_key = self._fork(job, fds)
    except BaseException:
      self._give_back(taken)
      raise
    os.close(inp)  # handed on: the session process holds its own
    s = {
      "sid": sid,
      "pid": pid,
      "pidfd": pidfd,
      "uid": uid,
      "init": init,
      "scratch": scratch,
      "out": out,
      "err": err,
      "code": code_fd,
      "call": None,
      "stopped": False,
      "cg": cg,
      "mntns_key": mntns_key,
    }
    self.sessions[sid] = s
    self.sel.register(pidfd, ("sess_dead", s))
    return s

  def session_call(self, req, fds):
    sid = req["session_id"]
    t0 = time.monotonic()
    s = self.sessions.get(sid)
    if s is not None and os.fstat(s["code"]).st_ino != os.fstat(fds["code"]).st_ino:
      # The host replaced the session's memfds: it no longer knows this interpreter.
      self.close_session({"kind": "abort_session", "session_id": sid})
      s = None
    if s is not None:  # the process already holds these files
      for fd in fds.values():
        os.close(fd)
    if s is not None and s["call"] is not None:
      self.reply(
        req["rid"],
        {
          "status": "internal_error",
          "stdout": b"",
          "exit_code": None,
          "stderr": b"session is busy with another call\n",
          "duration_s": 0.0,
        },
      )
      return
    if s is None:
      s = self._start_session(sid, fds)
    s["call"] = {
      "rid": req["rid"],
      "t0": t0,
      "deadline": t0 + req["timeout_s"],
      "killed": None,
      "running": False,
    }
    if s["stopped"]:
      self._dispatch(s)

  def _dispatch(self, s):
    """The session process is stopped: resume it on the call the host loaded into its memfds
    (code, stdin; output emptied and rewound) before sending the request."""
    call = s["call"]
    if s["cg"] is not None:
      self.cg.rebase(s["cg"])
    call["running"] = True
    s["stopped"] = False
    try:
      signal.pidfd_send_signal(s["pidfd"], signal.SIGCONT)
    except ProcessLookupError:
      pass

  def _session_leftovers(self, s):
    """Other threads or processes of the session still alive while its main thread stopped."""
    pid = s["pid"]
    try:
      tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
      return None
    live = []
    for t in tasks:
      try:
        with open(f"/proc/{pid}/task/{t}/stat") as f:
          state = f.read().rsplit(")", 1)[1].split()[0]
      except (OSError, IndexError):
        continue  # already gone
      if state not in ("Z", "X"):  # a joined thread may still be finishing its exit
        live.append(t)
    if len(live) > 1:
      return f"{len(live) - 1} thread(s) still running after the call"
    kids = []
    for t in tasks:
      try:
        with open(f"/proc/{pid}/task/{t}/children") as f:
          kids += f.read().split()
      except OSError:
        pass
    if s["init"]:
      try:
        with open(f"/proc/{s['init'][0]}/task/{s['init'][0]}/children") as f:
          kids += [k for k in f.read().split() if k != str(pid)]
      except OSError:
        pass
    if kids:
      return f"{len(kids)} process(es) still running after the call"
    return None

  def on_sigchld(self):
    try:
      while os.read(self.sig_r, 4096):
        pass
    except BlockingIOError:
      pass
    self.sweep_orphans()
    for s in list(self.sessions.values()):
      if s["stopped"]:
        continue
      try:
        info = os.waitid(os.P_PID, s["pid"], os.WSTOPPED | os.WNOHANG)
      except ChildProcessError:
        continue
      if info is None:
        continue
      s["stopped"] = True
      call = s["call"]
      if call is None:
        continue
      if not call["running"]:
        self._dispatch(s)
        continue
      left = self._session_leftovers(s)
      for _ in range(5):  # a thread in the middle of exiting is gone within microseconds
        if left is None:
          break
        time.sleep(0.001)
        left = self._session_leftovers(s)
      if left is not None:
        call["left"] = left
        self.kill_session(s, "leftover")
        continue
      rc = self._end_mark(s["pid"])
      if rc is None:
        # The loop marks the end of a call with a pending signal before it stops: a stop
        # without one is the user code's own, mid-call. Resuming it would run the rest of this
        # call as the next one's: the session ends here.
        call["left"] = "the call stopped its own process"
        self.kill_session(s, "self-stop")
        continue
      self._session_result(s, rc, dead=False, peak=self._peak_rss(s["pid"]) if rc else 0)

  @staticmethod
  def _end_mark(pid):
    """0 or 1 when the stopped session process has the loop's end-of-call signal pending
    (SESSION_DONE_OK / SESSION_DONE_ERR, from the kernel's account in /proc: no descriptor
    of the call's carries it), None otherwise (a stop of the user code's own)."""
    try:
      with open(f"/proc/{pid}/status") as f:
        pending = 0
        for line in f:
          if line.startswith(("SigPnd:", "ShdPnd:")):
            pending |= int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
      return None
    ok, err = (pending >> (sig - 1) & 1 for sig in (SESSION_DONE_OK, SESSION_DONE_ERR))
    if ok == err:
      return None
    return 0 if ok else 1

  @staticmethod
  def _peak_rss(pid):
    """VmHWM of a stopped (still mapped) process, in bytes; 0 when unreadable."""
    try:
      with open(f"/proc/{pid}/status") as f:
        for line in f:
          if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
      pass
    return 0

  def _session_result(self, s, rc, dead, peak=0, cpu_out=False):
    call = s["call"]
    s["call"] = None
    _, over_o = self._output_size(s["out"])
    _, over_e = self._output_size(s["err"])
    err = b""  # appended by the host after the call's own stderr
    mem_out = rc != 0 and (
      (s.get("cg") is not None and self.cg.hit_limit(s["cg"])) or self._memory_grew(peak)
    )
    status = self._classify(rc, call["killed"], over_o or over_e, cpu_out, mem_out)
    if call.get("left") and call["killed"] == "self-stop":
      err += f"\n[{call['left']}]\n".encode()
    elif call.get("left"):
      err += f"\n[{call['left']}: they are not allowed to outlive it]\n".encode()
    if dead:
      err += b"\n[session terminated: its state is lost; the next call starts a fresh session]\n"
      if status == "ok":
        status = "error"
    self.reply(
      call["rid"],
      {
        "status": status,
        "stdout": b"",
        "stderr": err,
        "exit_code": rc,
        "duration_s": time.monotonic() - call["t0"],
      },
    )

  def kill_session(self, s, reason):
    if s["call"] is not None and s["call"]["killed"] is None:
      s["call"]["killed"] = reason
    for fd in (s["pidfd"], s["init"][1] if s["init"] else None):
      if fd is not None:
        try:
          signal.pidfd_send_signal(fd, signal.SIGKILL)
        except ProcessLookupError:
          pass
    if not self.cfg["pidns"]:
      self._kill_group_and_uid(s["pid"], s["uid"])

  def on_session_dead(self, s):
    """The session process `s` (a record: a closed one is no longer in `sessions`) exited."""
    if "reaped" in s:
      return
    pid, status, usage = os.wait4(s["pid"], os.WNOHANG)
    if pid == 0:  # stale event, or killed but not yet gone (e.g. in an uninterruptible sleep)
      return
    s["reaped"] = True
    if self.sessions.get(s["sid"]) is s:
      del self.sessions[s["sid"]]
    self.dying.pop(s["pidfd"], None)
    self._watch_children()
    self.sel.unregister(s["pidfd"])
    rc = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    if s["call"] is not None and s["call"].get("running"):
      cpu_out = os.WIFSIGNALED(status) and self._cpu_limit_kill(
        os.WTERMSIG(status), usage, self.cfg["session_cpu_s"]
      )
      self._session_result(s, rc, dead=True, peak=usage.ru_maxrss * 1024, cpu_out=cpu_out)
    elif s["call"] is not None:  # died before it ever ran the call
      call = s["call"]
      self.reply(
        call["rid"],
        {
          "status": "internal_error",
          "stdout": b"",
          "exit_code": rc,
          "stderr": b"session process failed to start\n",
          "duration_s": time.monotonic() - call["t0"],
        },
      )
    for fd in (s["pidfd"], s["out"], s["err"], s["code"]):
      os.close(fd)
    self._end(s)

  def close_session(self, req):
    s = self.sessions.get(req["session_id"])
    if s is not None:
      self.kill_session(s, "closed")
      # A next call with this id starts fresh at once; the process is reaped (and its call,
      # if any, answered) when its pidfd says it is gone. Never waited for here: a process
      # stuck in the kernel must not stall the template (and with it every other call).
      del self.sessions[s["sid"]]
      self.dying[s["pidfd"]] = s
      self._watch_children()
      self.on_session_dead(s)
    if req["kind"] == "close_session":
      self.reply(req["rid"], {"closed": s is not None})

  # -- loop
  def reply(self, rid, result):
    result["rid"] = rid
    write_frame(self.ctl_out, result)

  def on_control(self):
    chunk = os.read(self.ctl_in, 1 << 20)
    if not chunk:
      raise EOFError
    self.buf += chunk
    while len(self.buf) >= 4:
      n = wire.frame_length(bytes(self.buf[:4]), MAX_REQUEST_BYTES)
      if len(self.buf) < 4 + n:
        break
      req = check_request(wire.decode(bytes(self.buf[4 : 4 + n])))
      del self.buf[: 4 + n]
      kind = req["kind"]
      if kind in ("close_session", "abort_session"):
        self.close_session(req)
      elif kind == "ping":
        self.reply(req["rid"], {"pong": True, "free_uids": len(self.free_uids)})
      elif kind == "shutdown":
        raise EOFError
      else:
        try:
          self.start_call(req, self.recv_call_fds(req["rid"]))
        except BaseException as e:
          self.reply(
            req["rid"],
            {
              "status": "internal_error",
              "stdout": b"",
              "exit_code": None,
              "stderr": f"sandbox failed to start the call: {e!r}\n".encode(),
              "duration_s": 0.0,
            },
          )

  def check_deadlines(self):
    now = time.monotonic()
    nxt = None
    for call in self.calls.values():
      if call["killed"] is None:
        if now >= call["deadline"]:
          call["killed"] = "timeout"
          for fd in (call["pidfd"], call["init"][1] if call["init"] else None):
            if fd is not None:
              try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
              except ProcessLookupError:
                pass
          if not self.cfg["pidns"]:
            self._kill_group_and_uid(call["pid"], call["uid"])
        else:
          nxt = call["deadline"] if nxt is None else min(nxt, call["deadline"])
    for s in self.sessions.values():
      c = s["call"]
      if c is not None and c["killed"] is None:
        if now >= c["deadline"]:
          self.kill_session(s, "timeout")
        else:
          nxt = c["deadline"] if nxt is None else min(nxt, c["deadline"])
    return None if nxt is None else min(max(0.0, nxt - now), 3600.0)

  def run(self):
    os.set_blocking(self.ctl_in, False)
    self.sel.register(self.ctl_in, ("ctl", None))
    self.sel.register(self.sig_r, ("sigchld", None))
    if self.reaper is not None:
      self.sel.register(self.reaper.pidfd, ("reaper", None))
    try:
      while True:
        timeout = self.check_deadlines()
        if self.reaper is not None and self.reaper.unsent:
          self.reaper.flush()
          timeout = 0.01 if timeout is None else min(timeout, 0.01)
        for what, arg in self.sel.poll(timeout):
          if what == "ctl":
            self.on_control()
          elif what == "call":
            self.finish_call(arg)
          elif what == "sigchld":
            self.on_sigchld()
          elif what == "sess_dead":
            self.on_session_dead(arg)
          elif what == "init":
            self.on_init_dead(arg)
          elif what == "reaper" and self.reaper.reap():
            self.sel.unregister(self.reaper.pidfd)
            os.close(self.reaper.pidfd)
    except (EOFError, wire.WireError):
      pass
    finally:
      self.shutdown()

  def shutdown(self):
    # Kill everything first, then reap the call processes before their namespaces' PID 1s:
    # a namespace's teardown waits until its zombies are reaped, and ours are our children.
    recs = list(self.calls.values()) + list(self.sessions.values()) + list(self.dying.values())
    inits = [r["init"] for r in recs if r.get("init")] + [
      (v[0], fd) for fd, v in self.reaping.items()
    ]
    for fd in [r["pidfd"] for r in recs] + [fd for _, fd in inits]:
      try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
      except OSError:
        pass
    for pid in [r["pid"] for r in recs] + [ipid for ipid, _ in inits]:
      try:
        os.waitpid(pid, 0)
      except OSError:
        pass
    for r in recs:
      if not self.cfg["pidns"]:
        try:
          os.killpg(r["pid"], signal.SIGKILL)
        except OSError:
          pass
      self._kill_uid(r["uid"])
    if self.cfg["private_scratch"]:
      try:
        os.rmdir(self.scratch_root)  # only ever a mount point here
      except OSError:
        pass
    else:
      wire.rmtree(self.scratch_root)
    if self.cg is not None:
      self.cg.close()


def _kill_uid_range(lo, hi):
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/status") as f:
        for line in f:
          if line.startswith("Uid:"):
            if lo <= int(line.split()[1]) < hi:
              os.kill(int(name), signal.SIGKILL)
            break
    except OSError:
      pass


def _blocked_ancestors(path):
  """Ancestors of `path` an unprivileged uid cannot traverse (no o+x), outermost first."""
  out = []
  parts = os.path.realpath(path).strip("/").split("/")
  for i in range(1, len(parts)):
    d = "/" + "/".join(parts[:i])
    try:
      if not os.stat(d).st_mode & 0o001:
        out.append(d)
    except OSError:
      pass
  return out


def expose_paths(paths):
  """Makes `paths` reachable by sandbox uids when an ancestor (e.g. /root, mode 700) is not.

  In a private mount namespace each blocking ancestor is covered by an empty tmpfs (mode 755)
  into which only the needed paths are bind-mounted back: the rest of that directory stays
  hidden. Returns a description of what was done ("" when nothing was needed).
  """
  need = {}
  for p in paths:
    for a in _blocked_ancestors(p):
      if not any(a.startswith(b + "/") for b in need):
        need.setdefault(a, []).append(os.path.realpath(p))
        break
  if not need:
    return ""
  if _libc.unshare(CLONE_NEWNS) != 0:
    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
  if _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
    raise OSError(ctypes.get_errno(), "mount --make-rprivate / failed")
  done = []
  for anc, targets in sorted(need.items()):
    fds = {t: os.open(t, os.O_PATH | os.O_CLOEXEC) for t in sorted(set(targets))}
    if _libc.mount(b"tmpfs", anc.encode(), b"tmpfs", 0, b"mode=0755,size=64k") != 0:
      raise OSError(ctypes.get_errno(), f"mount tmpfs on {anc} failed")
    for t, fd in fds.items():
      os.makedirs(t, mode=0o755, exist_ok=True)
      if _libc.mount(f"/proc/self/fd/{fd}".encode(), t.encode(), None, MS_BIND | MS_REC, None) != 0:
        raise OSError(ctypes.get_errno(), f"bind {t} failed")
      os.close(fd)
    done.append(f"{anc} -> {sorted(fds)}")
  return "; ".join(done)


PR_CAPBSET_DROP = 24
PR_SET_NAME = 15
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
MNT_DETACH = 2
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MS_RDONLY, MS_REMOUNT = 1, 32


class _CapHeader(ctypes.Structure):
  _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
  _fields_ = [
    ("effective", ctypes.c_uint32),
    ("permitted", ctypes.c_uint32),
    ("inheritable", ctypes.c_uint32),
  ]


# The capabilities the template uses after its start (a root template started by bubblewrap as
# real root holds every one the host has; `--cap-add` does not narrow it): its mounts and
# namespaces (SYS_ADMIN; SYS_CHROOT too, which setns(2) into a mount namespace asks for: the
# template steps back into its own after forking each call into the call's own, see
# Template._fork; it adds nothing to SYS_ADMIN in the same namespace, which can already
# pivot_root), a call's uid switch (SETUID, SETGID), its scratch and preloaded files (CHOWN,
# DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER), killing calls of other uids (KILL), rlimits
# (SYS_RESOURCE). Everything else (loading kernel modules, raw I/O, ptrace, bpf, net admin, ...)
# is dropped from its effective and permitted sets, so an escape into it does not hold them.
TEMPLATE_CAPS = (0, 1, 2, 3, 5, 6, 7, 18, 21, 24)


def _drop_capability_sets():
  """Empties the bounding, ambient and inheritable sets and narrows the effective and permitted
  sets to TEMPLATE_CAPS (a call loses those too at its uid switch): no exec of any file can give
  a call's process a capability back."""
  cap = 0
  while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
    cap += 1
  if cap == 0 or ctypes.get_errno() != 22:  # EINVAL: past the last capability
    raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP({cap}) failed")
  _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
  hdr, data = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3
  if _libc.capget(ctypes.byref(hdr), data) != 0:
    raise OSError(ctypes.get_errno(), "capget failed")
  keep = sum(1 << c for c in TEMPLATE_CAPS)
  for i, d in enumerate(data):  # data[0]: capabilities 0-31, data[1]: 32-63
    d.inheritable = 0
    d.effective &= keep >> (32 * i) & 0xFFFFFFFF
    d.permitted &= keep >> (32 * i) & 0xFFFFFFFF
  if _libc.capset(ctypes.byref(hdr), data) != 0:
    raise OSError(ctypes.get_errno(), "capset failed")


def harden_template(cfg):
  """Once per template, before any call; every call inherits it (no per-call cost).

  - oom_score_adj 1000: under memory pressure the kernel's OOM killer takes sandbox processes
    before the trainer (a call cannot lower it: that needs CAP_SYS_RESOURCE).
  - As root (every level but `rlimits`), in the template's own mount namespace: a new /proc
    instance with hidepid=invisible (gid 0 exempt: the template), so a call, which runs as its
    own uid, sees only its own processes; /dev/pts detached, so /dev/ptmx opens no terminal;
    the bounding, ambient and inheritable capability sets emptied.
  Returns (what could not be done, "" when everything was; whether the template's mounts are
  private, so that each call may mount its own scratch without it reaching the host).
  """
  failed = []
  try:
    with open("/proc/self/oom_score_adj", "w") as f:
      f.write("1000")
  except OSError as e:
    failed.append(f"oom_score_adj: {e.strerror}")
  if not cfg["drop_uid"]:
    return "; ".join(failed), False
  if _libc.unshare(CLONE_NEWNS) != 0:
    failed.append(f"unshare(CLONE_NEWNS): errno {ctypes.get_errno()}")
    return "; ".join(failed), False
  if _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
    failed.append(f"mount --make-rprivate /: errno {ctypes.get_errno()}")
    return "; ".join(failed), False
  flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
  if _libc.mount(b"proc", b"/proc", b"proc", flags, b"hidepid=invisible,gid=0") != 0:
    failed.append(f"mount proc hidepid=invisible: errno {ctypes.get_errno()}")
  for pts in (b"/dev/pts",):
    if os.path.ismount(pts) and _libc.umount2(pts, MNT_DETACH) != 0:
      failed.append(f"umount /dev/pts: errno {ctypes.get_errno()}")
  if os.path.exists("/dev/ptmx") and not os.path.islink("/dev/ptmx"):
    # A real ptmx node (not bwrap's pts/ptmx link): cover it with /dev/null.
    if _libc.mount(b"/dev/null", b"/dev/ptmx", None, MS_BIND, None) != 0:
      failed.append(f"bind /dev/null over /dev/ptmx: errno {ctypes.get_errno()}")
  try:
    _drop_capability_sets()
  except OSError as e:
    failed.append(f"capabilities: {e}")
  return "; ".join(failed), True


def check_imports(cfg, modules):
  """Forks a child that drops to a sandbox uid and opens every module's files; "" when all
  are readable, else a message naming the first that is not."""
  import importlib.util

  files = []
  for name in modules:
    try:
      spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
      spec = None
    if spec is None or not spec.origin or not os.path.isabs(spec.origin):
      continue
    files.append(spec.origin)
  r, w = os.pipe()
  pid = os.fork()
  if pid == 0:
    try:
      os.close(r)
      if cfg["drop_uid"]:
        os.setgroups([])
        os.setgid(cfg["uid_lo"])
        os.setuid(cfg["uid_lo"])
      msg = b""
      for f in files:
        try:
          with open(f, "rb") as fh:
            fh.read(1)
          os.listdir(os.path.dirname(f))
        except OSError as e:
          msg = f"{f}: {e.strerror}".encode()
          break
      os.write(w, msg[:4000])
    finally:
      os._exit(0)
  os.close(w)
  msg = b""
  while True:
    b = os.read(r, 4096)
    if not b:
      break
    msg += b
  os.close(r)
  os.waitpid(pid, 0)
  return msg.decode("utf-8", "replace")


_STDLIB_PROBE = (
  "json",
  "fractions",
  "decimal",
  "itertools",
  "collections",
  "re",
  "random",
  "statistics",
  "encodings.idna",
)


def main():
  ctl_in, ctl_out = os.dup(0), os.dup(1)
  devnull = os.open(os.devnull, os.O_RDWR)
  os.dup2(devnull, 0)
  os.dup2(devnull, 1)
  os.set_inheritable(ctl_in, False)
  os.set_inheritable(ctl_out, False)
  _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # never outlive the host
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the host's terminal is the host's
  cfg = read_frame(ctl_in)
  t0 = time.monotonic()
  exposed = ""
  if cfg["expose_paths"]:
    try:
      exposed = expose_paths(cfg["expose_paths"])
    except OSError as e:
      exposed = f"failed: {e}"
  hardening, cfg["private_scratch"] = harden_template(cfg)
  # Forked before the preloads (a small process) and before anything of a call's exists.
  reaper = MountNamespaceReaper() if cfg["private_scratch"] else None
  # World-writable places a call could otherwise fill or share with another call: each call
  # gets its own tmpfs bound over all of them (/tmp last: the source is the call's cwd).
  cfg["shared_tmp_dirs"] = [
    d for d in ("/var/tmp", "/dev/shm", "/tmp") if os.path.isdir(d) and not os.path.islink(d)
  ]
  cfg["tmp_keeps"] = _under(cfg.get("keep_paths", ()), cfg["shared_tmp_dirs"])
  os.environ.update(cfg["template_env"])
  loaded = []
  for name in cfg["preload"]:
    try:
      __import__(name)
      loaded.append(name)
    except Exception as e:  # a missing optional module must not kill the pool
      sys.stderr.write(f"[code_pool template] could not preload {name}: {e!r}\n")
  if cfg.get("warmup_code"):
    try:
      exec(compile(cfg["warmup_code"], "<warmup>", "exec"), {"__name__": "__warmup__"})
    except BaseException as e:
      sys.stderr.write(f"[code_pool template] warmup failed: {e!r}\n")
  import_error = check_imports(cfg, _STDLIB_PROBE + tuple(loaded))
  vm = 0
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmSize:"):
        vm = int(line.split()[1]) * 1024
  # memory_limit_mb holds the call's memory, its scratch tmpfs and its two output memfds
  # (RLIMIT_FSIZE caps each): the address space gets what the other two leave.
  lim = cfg["limits"]
  carved = 2 * (lim["max_output_bytes"] + 1)
  if cfg["private_scratch"]:
    carved += lim["scratch_bytes"]
  cfg["as_limit"] = vm + (lim["memory_limit_mb"] << 20) - carved
  prog = seccomp_program(os.uname().machine, cfg["allow_subprocesses"], cfg["allow_sockets"])
  cfg["seccomp"] = build_seccomp(prog) if prog is not None and cfg["use_seccomp"] else None
  if cfg["drop_uid"] and not cfg["pidns"]:
    _kill_uid_range(cfg["uid_lo"], cfg["uid_hi"])  # leftovers of a dead predecessor
  tpl = Template(cfg, ctl_in, ctl_out, reaper)
  if cfg["private_scratch"]:
    # Every call's home is the same path (its own tmpfs there): its environment is set here
    # once and inherited, instead of rebuilt in each call (~90 copy-on-write faults a call).
    _set_call_env(cfg, "/tmp" if "/tmp" in cfg["shared_tmp_dirs"] else cfg["scratch_root"])
    cfg["call_env_set"] = True
  _prebuild_std_streams()
  _warm_user_path()
  gc.collect()
  gc.freeze()  # keep the preloaded heap out of the children's GC passes: fewer CoW faults
  t_huge = time.monotonic()
  huge = collapse_heap_to_huge_pages()  # last: the heap is final here
  t_huge = time.monotonic() - t_huge
  write_frame(
    ctl_out,
    {
      "ready": True,
      "pid": os.getpid(),
      "preloaded": loaded,
      "startup_s": time.monotonic() - t0,
      "as_limit": cfg["as_limit"],
      "pidns_self": os.getpid() in (1, 2),
      "import_error": import_error,
      "exposed": exposed,
      "hardening_failed": hardening,
      "seccomp": prog is not None and cfg["use_seccomp"],
      "huge_page_bytes": huge,
      "huge_page_s": t_huge,
    },
  )
  tpl.run()


def userns_launch(spec_json, argv):
  """Starts `argv` (bubblewrap and the template) in a user namespace of its own (issue 40,
  class 5), as the host's root, before anything else runs: so an escape into the template lands
  in the namespace's root, an unprivileged host uid, with capabilities in that namespace only.

  `spec_json`: {"uid_map", "gid_map": the maps' text (the namespace's root on a free host uid,
  the pool's sandbox uids 1:1), "expose": paths bubblewrap must bind}. Steps: a private mount
  namespace in which `expose_paths` makes the install reachable (its parents, e.g. /root mode
  700, belong to a host uid unmapped inside: not even the namespace's root may enter them);
  `unshare(CLONE_NEWUSER)`; a child left in the host's namespace writes the maps (a process
  cannot map its own namespace to host uids other than its own); uid and gid 0 inside; exec.
  The host's process becomes bubblewrap itself (no process stays behind). Any failure is one
  line on stderr and exit status 70, which the pool reports as the level's failure."""
  import json

  def fail(msg):
    os.write(2, f"sandbox user namespace: {msg}\n".encode())
    os._exit(70)

  spec = json.loads(spec_json)
  try:
    expose_paths(spec["expose"])
  except OSError as e:
    fail(f"exposing the install failed: {e}")
  go_r, go_w = os.pipe()
  done_r, done_w = os.pipe()
  writer = os.fork()
  if writer == 0:
    try:
      os.close(go_w)
      os.close(done_r)
      if os.read(go_r, 1) == b"u":
        target = os.getppid()
        for name in ("uid_map", "gid_map"):
          with open(f"/proc/{target}/{name}", "w") as f:
            f.write(spec[name])
        os.write(done_w, b"m")
    except BaseException as e:
      os.write(2, f"sandbox user namespace: writing the maps failed: {e}\n".encode())
    os._exit(0)
  os.close(go_r)
  os.close(done_w)
  if _libc.unshare(CLONE_NEWUSER) != 0:
    err = ctypes.get_errno()
    os.kill(writer, signal.SIGKILL)
    os.waitpid(writer, 0)
    fail(f"unshare(CLONE_NEWUSER): {os.strerror(err)}")
  os.write(go_w, b"u")
  mapped = os.read(done_r, 1) == b"m"
  os.waitpid(writer, 0)
  if not mapped:
    fail("the uid/gid maps were not written")
  try:
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    os.execvp(argv[0], argv)
  except OSError as e:
    fail(f"{argv[0]}: {e}")


if __name__ == "__main__":
  if sys.argv[1:2] == ["--userns-launch"]:
    userns_launch(sys.argv[2], sys.argv[3:])
  else:
    main()
