"""Asyncio pool that runs model-written Python in isolated, rlimited, forked sandboxes.

    async with CodePool(num_workers=4) as pool:
        r = await pool.execute("print(1+1)", stdin="", timeout_s=4.0)   # ExecResult
        rs = await pool.execute_many([{"code": ..., "stdin": ...}, ...])
        r = await pool.execute("x = 1", session_id="traj-7")          # stateful (ASTER)
        await pool.close_session("traj-7")
        v = await pool.run_function(fn, *args, timeout_s=5.0)          # e.g. the verifier

Design (see README.md here): `num_templates` long-lived template processes
(`sandbox_template.py`) each import numpy/sympy once and then fork one child per call, so a call
costs a fork, not an interpreter start. With bubblewrap each template lives in its own sandbox
(read-only system view, private /tmp, no network, own PID/IPC/UTS namespaces) and gives every call
a fresh nested PID namespace, so one SIGKILL removes everything the call started. The isolation
level actually in force is chosen at start-up, logged, and exposed as `pool.isolation_level`:

  "namespaces"  bubblewrap sandbox + per-call PID namespace + unprivileged uid
  "pidns"       root without bubblewrap: per-call PID namespace + uid (host fs)
  "uid"         root: unprivileged uid per call; escapees killed by uid; no sockets
  "rlimits"     not root: rlimits + process group; the template is the calls' child subreaper

All levels apply a seccomp filter (no namespaces, mounts, keyrings, SysV / POSIX message-queue
IPC, sockets; no new processes unless `allow_subprocesses`; with `allow_sockets` at the two
namespace levels, sockets work inside a per-call network + IPC namespace of their own), RLIMIT_CPU/AS/NOFILE/FSIZE/CORE (+NPROC), a scrubbed environment
with accelerators hidden, a private scratch tmpfs per call (root levels), and a wall-clock
SIGKILL. Host and template speak `wire.py` frames (never pickle); a call's code, stdin and output
travel only in memfds the host makes and passes over a socket (`_CallIO`), never through the
template's heap; every number a caller passes is checked (`check_seconds`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import fcntl
import itertools
import json
import logging
import math
import os
import pickle
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rstar_jax.tools import cgroups, wire

log = logging.getLogger(__name__)

# "session_lost": a session call whose tool node (or Ray actor) died with the session; never
# re-run on a fresh session (client.py, ray_pool.py).
STATUSES = (
  "ok",
  "error",
  "timeout",
  "memory_limit",
  "output_limit",
  "internal_error",
  "session_lost",
)
FAILURE_STATUSES = frozenset(STATUSES[1:]) | {"parse_error"}
ISOLATION_LEVELS = ("namespaces", "pidns", "uid", "rlimits")
_TEMPLATE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_template.py")
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Accelerators are hidden by setting these empty (an absent variable would expose every device).
_HIDDEN_DEVICES = (
  "CUDA_VISIBLE_DEVICES",
  "HIP_VISIBLE_DEVICES",
  "ROCR_VISIBLE_DEVICES",
  "GPU_DEVICE_ORDINAL",
)
# Documented bounds of every number a caller passes (ValueError outside them).
MAX_TIMEOUT_S = 3600.0  # per call (execute / run_function / sessions)
MAX_QUEUE_TIMEOUT_S = 86400.0
MAX_CODE_BYTES = 64 << 20  # code and stdin of one call, each
_THREAD_ENV = {
  "OPENBLAS_NUM_THREADS": "1",
  "OMP_NUM_THREADS": "1",
  "MKL_NUM_THREADS": "1",
  "NUMEXPR_NUM_THREADS": "1",
}


@dataclasses.dataclass(frozen=True)
class ExecResult:
  """Outcome of one tool call.

  status: one of STATUSES. stdout/stderr: decoded text, each capped at max_output_bytes.
  duration_s: wall time inside the sandbox (fork to exit). exit_code: the user process's exit
  code (128+n when killed by signal n), None when the call never ran.
  """

  status: str
  stdout: str = ""
  stderr: str = ""
  duration_s: float = 0.0
  exit_code: int | None = None

  @property
  def ok(self) -> bool:
    return self.status == "ok"


class FunctionRunError(RuntimeError):
  """`run_function` failed: `status` is an ExecResult status, `detail` the traceback or reason."""

  def __init__(self, status: str, detail: str):
    super().__init__(f"run_function {status}: {detail}")
    self.status = status
    self.detail = detail


class QueueTimeout(Exception):
  """No worker became free within the queue timeout."""


_DEFAULT_WARMUP = """
try:
    import numpy as _np, sympy as _sp
    _x, _y = _sp.symbols('x y')
    _sp.solve(_x**2 - 3*_x + 2, _x); _sp.simplify(_sp.sin(_x)**2 + _sp.cos(_x)**2)
    _sp.factor(_x**2 - _y**2); _sp.integrate(_x**2, _x); _sp.Rational(1, 3) + 1
    _sp.nsimplify(0.5); _sp.sqrt(8); _sp.latex(_x**2); _sp.isprime(97); _sp.factorint(360)
    _np.linalg.det(_np.eye(2)); _np.linalg.solve(_np.eye(2), _np.ones(2)); _np.fft.fft(_np.ones(4))
    _np.random.default_rng(0).random(2)
except Exception:
    pass
"""


@dataclasses.dataclass(frozen=True)
class PoolConfig:
  """Limits and layout of a CodePool. Sizes in MiB/bytes, times in seconds."""

  num_workers: int = 4  # max calls executing at once (sessions idle for free)
  num_templates: int | None = None  # warm template processes; default min(workers, cpus)
  timeout_s: float = 4.0  # default wall-clock limit per call (rStar README: 4 s)
  # Everything a call may add on top of the template's address space: its own memory, its
  # scratch tmpfs (scratch_mb) and its output memfds (2 x max_output_bytes) together.
  memory_limit_mb: int = 1024
  max_output_bytes: int = 1 << 20  # cap on stdout and on stderr (and on any file written)
  max_procs: int = 64  # RLIMIT_NPROC per call (processes + threads)
  max_open_files: int = 128  # RLIMIT_NOFILE
  # Size of each call's private scratch tmpfs (its cwd, $HOME, /tmp, /var/tmp and /dev/shm at
  # every level but "rlimits"); carved out of memory_limit_mb. Default: memory_limit_mb // 8.
  scratch_mb: int | None = None
  isolation: str = "auto"  # "auto" (strongest available) or exactly one level
  preload: tuple[str, ...] = ("numpy", "sympy")
  # Run once in each template after preloading: pulls in the lazily imported submodules that
  # typical math snippets touch, so each call does not import them again after its fork.
  warmup_code: str = _DEFAULT_WARMUP
  python: str = sys.executable
  session_timeout_cpu_s: int = 3600  # RLIMIT_CPU of a whole session process
  startup_timeout_s: float = 180.0
  reply_grace_s: float = 30.0  # host-side backstop past the call timeout
  queue_timeout_s: float | None = None
  # First sandbox uid. Default: a range of UID_SLOT_SIZE uids claimed from a host-wide lock
  # directory for the pool's lifetime, so two pools on one host never share a uid.
  uid_base: int | None = None
  uids_per_template: int = 1024
  # Live sessions at most (default: half the sandbox uids, so plain calls always find one). A
  # new session past the cap (or past its template's share of uids) closes the least recently
  # used idle session; a session idle longer than `session_idle_ttl_s` is closed too. Its next
  # call starts fresh and says why ("[session evicted: ...]").
  max_sessions: int | None = None
  session_idle_ttl_s: float | None = 900.0
  extra_ro_binds: tuple[str, ...] = ()  # more host paths visible read-only (namespaces level)
  # Calls may fork/spawn processes. Off by default: with processes blocked (seccomp) a call is
  # one address space, so RLIMIT_AS bounds the whole call's memory (no cgroup needed); with
  # them allowed a call may hold up to max_procs x memory_limit_mb.
  allow_subprocesses: bool = False
  # Calls may create sockets (namespaces / pidns levels only; refused at uid / rlimits). Off by
  # default: the filter refuses socket/socketpair, so no call can reach another call, the host
  # or a network, and no per-call network namespace is needed. On: each call gets its own
  # network + IPC namespace (loopback only, empty), which costs ~1.2 ms of kernel time per call
  # (namespace set-up and teardown; ~15% of a trivial call's cost, benchmarks/code_pool.py).
  allow_sockets: bool = False
  seccomp: bool = True  # install the call filter (see README); off only to debug
  # A memory + pids cgroup per call (limit memory_limit_mb, max_procs): "auto" where a writable
  # hierarchy has both controllers (else RLIMIT_AS only, logged and in `pool.memory_bound`),
  # "required" (start-up fails without), "off".
  cgroups: str = "auto"
  # At the namespaces level, the template in a user namespace of its own (issue 40, class 5):
  # its root is a free host uid of the pool's range, the sandbox uids are mapped 1:1, so an
  # escape from a call into the template holds no host privilege. "auto": where the kernel
  # allows it (else the host's root, logged); "required": start-up fails without; "off".
  template_userns: str = "auto"

  def __post_init__(self):
    if self.num_workers < 1:
      raise ValueError(f"PoolConfig.num_workers must be >= 1, got {self.num_workers}")
    if self.num_templates is not None and self.num_templates < 1:
      raise ValueError(f"PoolConfig.num_templates must be >= 1, got {self.num_templates}")
    check_seconds("PoolConfig.timeout_s", self.timeout_s, MAX_TIMEOUT_S)
    check_seconds("PoolConfig.startup_timeout_s", self.startup_timeout_s, MAX_QUEUE_TIMEOUT_S)
    check_seconds("PoolConfig.reply_grace_s", self.reply_grace_s, MAX_TIMEOUT_S)
    if self.queue_timeout_s is not None:
      check_seconds("PoolConfig.queue_timeout_s", self.queue_timeout_s, MAX_QUEUE_TIMEOUT_S, True)
    if self.session_idle_ttl_s is not None:
      check_seconds("PoolConfig.session_idle_ttl_s", self.session_idle_ttl_s, MAX_QUEUE_TIMEOUT_S)
    if self.max_sessions is not None and (
      isinstance(self.max_sessions, bool)
      or not isinstance(self.max_sessions, int)
      or self.max_sessions < 1
    ):
      raise ValueError(f"PoolConfig.max_sessions must be an int >= 1, got {self.max_sessions!r}")
    for name in (
      "num_workers",
      "memory_limit_mb",
      "max_output_bytes",
      "max_procs",
      "max_open_files",
      "session_timeout_cpu_s",
      "uids_per_template",
    ):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"PoolConfig.{name} must be an int, got {type(v).__name__} {v!r}")
    if not 1 <= self.session_timeout_cpu_s <= 10**6:
      raise ValueError(
        f"PoolConfig.session_timeout_cpu_s must be in [1, 1e6], got {self.session_timeout_cpu_s}"
      )
    if self.max_output_bytes > 1 << 30 or self.memory_limit_mb > 1 << 22:
      raise ValueError(
        "PoolConfig.max_output_bytes must be <= 1 GiB and memory_limit_mb <= 4 TiB,"
        f" got {self.max_output_bytes} and {self.memory_limit_mb}"
      )
    if self.memory_limit_mb < 16:
      raise ValueError(f"PoolConfig.memory_limit_mb must be >= 16, got {self.memory_limit_mb}")
    if self.max_output_bytes < 1024:
      raise ValueError(f"PoolConfig.max_output_bytes must be >= 1024, got {self.max_output_bytes}")
    if self.max_procs < 1 or self.max_open_files < 16:
      raise ValueError(
        "PoolConfig.max_procs must be >= 1 and max_open_files >= 16, got "
        f"{self.max_procs} and {self.max_open_files}"
      )
    if self.isolation not in ("auto",) + ISOLATION_LEVELS:
      raise ValueError(
        f"PoolConfig.isolation must be 'auto' or one of {ISOLATION_LEVELS}, got {self.isolation!r}"
      )
    if self.scratch_mb is not None and (
      isinstance(self.scratch_mb, bool)
      or not isinstance(self.scratch_mb, int)
      or self.scratch_mb < 1
    ):
      raise ValueError(f"PoolConfig.scratch_mb must be an int >= 1, got {self.scratch_mb!r}")
    carved = (self.scratch_bytes + 2 * self.max_output_bytes) >> 20
    if carved > self.memory_limit_mb // 2:
      raise ValueError(
        f"PoolConfig.scratch_mb + 2 x max_output_bytes must fit in half of memory_limit_mb "
        f"({self.memory_limit_mb // 2} MiB), got {carved} MiB"
      )
    for name in ("cgroups", "template_userns"):
      if getattr(self, name) not in ("auto", "required", "off"):
        raise ValueError(
          f"PoolConfig.{name} must be 'auto', 'required' or 'off', got {getattr(self, name)!r}"
        )
    if self.uids_per_template < 8:
      raise ValueError(f"PoolConfig.uids_per_template must be >= 8, got {self.uids_per_template}")

  @property
  def scratch_bytes(self) -> int:
    mb = self.scratch_mb if self.scratch_mb is not None else max(1, self.memory_limit_mb // 8)
    return mb << 20


# ---------------------------------------------------------------------------------------------
# isolation detection
def check_seconds(name: str, value: Any, upper: float, allow_zero: bool = False) -> float:
  """`value` as a float in (0, upper] (or [0, upper]); ValueError naming `name` otherwise."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ValueError(f"{name} must be a number of seconds, got {type(value).__name__} {value!r}")
  v = float(value)
  lo_ok = v >= 0 if allow_zero else v > 0
  if not (math.isfinite(v) and lo_ok and v <= upper):
    raise ValueError(
      f"{name} must be finite and in {'[' if allow_zero else '('}0, {upper:g}], got {value!r}"
    )
  return v


def _is_root() -> bool:
  return os.geteuid() == 0


# (interpreter, bound paths) -> "" when a template can run in its own user namespace, else why.
_USERNS_PROBED: dict[tuple, str] = {}


def _sandbox_python(cfg: PoolConfig) -> str:
  """`cfg.python` with its directories resolved and its own name kept. Inside bubblewrap only
  real paths are bound: a venv reached through a symlinked directory (a worktree's `.venv ->
  /elsewhere/.venv`) would not exist there, and the level would silently fall to `pidns`; the
  last component stays a link so the interpreter still finds its venv's `pyvenv.cfg`."""
  return os.path.join(os.path.realpath(os.path.dirname(cfg.python)), os.path.basename(cfg.python))


def _bwrap_binds(cfg: PoolConfig) -> list[str]:
  # Only what imports need: the Python install, the venv and this package (not the rest of the
  # project tree, which may hold checkpoints, logs or credentials). Add more via extra_ro_binds.
  paths = [
    os.path.realpath(p)
    for p in (
      sys.base_prefix,
      sys.prefix,
      os.path.join(_PROJECT_ROOT, "rstar_jax"),
      os.path.dirname(os.path.realpath(cfg.python)),
      os.path.dirname(_sandbox_python(cfg)),
    )
  ]
  paths += list(cfg.extra_ro_binds)
  out: list[str] = []
  for p in sorted(set(paths), key=len):
    if p.startswith("/usr/") or p == "/usr" or any(p.startswith(q + "/") for q in out) or p in out:
      continue
    out.append(p)
  return out


def _bwrap_argv(cfg: PoolConfig) -> list[str]:
  bwrap = shutil.which("bwrap")
  if bwrap is None:
    raise FileNotFoundError("bwrap")
  argv = [
    bwrap,
    "--unshare-pid",
    "--unshare-net",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--die-with-parent",
    "--new-session",
    "--clearenv",
    "--ro-bind",
    "/usr",
    "/usr",
  ]
  for name in ("lib", "lib64", "bin", "sbin"):
    if os.path.exists(f"/usr/{name}"):
      argv += ["--symlink", f"usr/{name}", f"/{name}"]
  argv += [
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--perms",
    "0755",
    "--size",
    str(1 << 20),  # the template's own /tmp: only the mount point of the calls' scratch
    "--tmpfs",
    "/tmp",
  ]
  made = {"/", "/usr", "/tmp", "/proc", "/dev"}
  for p in _bwrap_binds(cfg):
    # bwrap would create missing parents as 0700, which the sandbox uid could not traverse.
    parts = p.strip("/").split("/")
    for i in range(1, len(parts)):
      d = "/" + "/".join(parts[:i])
      if d not in made:
        argv += ["--perms", "0755", "--dir", d]
        made.add(d)
    argv += ["--ro-bind", p, p]
    made.add(p)
  for cap in (
    "CAP_SYS_ADMIN",
    "CAP_SYS_CHROOT",  # setns(2) back into the template's own mount namespace after each fork
    "CAP_SETUID",
    "CAP_SETGID",
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_KILL",
    "CAP_SETPCAP",  # to empty the bounding set (sandbox_template.harden_template)
  ):
    argv += ["--cap-add", cap]
  for k, v in _THREAD_ENV.items():
    argv += ["--setenv", k, v]
  argv += ["--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8", "--chdir", "/tmp"]
  return argv


def _probe(argv: list[str]) -> bool:
  try:
    return (
      subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=60,
        start_new_session=True,
      ).returncode
      == 0
    )
  except (OSError, subprocess.SubprocessError):
    return False


_PIDNS_PROBE = (
  "import ctypes,os,sys;l=ctypes.CDLL(None,use_errno=True);"
  "sys.exit(0 if l.unshare(0x20000000)==0 else 1)"
)


def detect_isolation(cfg: PoolConfig) -> str:
  """ "auto": the strongest level this machine allows; a level name: exactly that level."""
  candidates = list(ISOLATION_LEVELS) if cfg.isolation == "auto" else [cfg.isolation]
  for level in candidates:
    if level == "namespaces":
      if (
        _is_root()
        and shutil.which("bwrap")
        and _probe(_bwrap_argv(cfg) + ["--", _sandbox_python(cfg), "-I", "-c", _PIDNS_PROBE])
      ):
        return level
    elif level == "pidns":
      if _is_root() and _probe([cfg.python, "-I", "-c", _PIDNS_PROBE]):
        return level
    elif level == "uid":
      if _is_root():
        return level
    else:
      return level
  raise RuntimeError(
    f"isolation {cfg.isolation!r} is not available on this machine "
    f"(root={_is_root()}, bwrap={shutil.which('bwrap')})"
  )


_DESCRIPTIONS = {
  "namespaces": "bubblewrap sandbox (pid/net/mount/ipc/uts namespaces, read-only system, "
  "private /tmp) + per-call PID namespace + unprivileged uid + seccomp (no sockets) "
  "+ rlimits",
  "pidns": "per-call PID namespace + unprivileged uid + seccomp (no sockets) + rlimits (host "
  "filesystem)",
  "uid": "unprivileged uid per call, escapees killed by uid + seccomp (no sockets) + rlimits "
  "(host filesystem)",
  "rlimits": "seccomp + rlimits + process group only: NOT isolated (host uid and filesystem)",
}


# ---------------------------------------------------------------------------------------------
_REPLY_FIELDS = {"rid": int}
_RESULT_FIELDS = {"status": str, "stdout": bytes, "stderr": bytes, "duration_s": float}


def _check_reply(msg: Any, max_output: int) -> dict:
  """A template reply, validated field by field (the template is sandboxed: trust nothing)."""
  wire.check_record(msg, _REPLY_FIELDS, "template reply")
  if "status" in msg:
    wire.check_record(msg, _RESULT_FIELDS, "template reply")
    if msg["status"] not in STATUSES:
      raise wire.WireError(f"template reply: unknown status {msg['status']!r}")
    if len(msg["stdout"]) > max_output or len(msg["stderr"]) > max_output + 4096:
      raise wire.WireError("template reply: output over the cap")
    ec = msg.get("exit_code")
    if ec is not None and (type(ec) is not int or not -1 <= ec <= 511):
      raise wire.WireError(f"template reply: bad exit_code {ec!r}")
    if not math.isfinite(msg["duration_s"]):
      raise wire.WireError("template reply: non-finite duration")
  return msg


_POOL_SERIAL = itertools.count()  # tags this process's pools' cgroup directories
_RESTART_NOTE = b"[session restarted: the sandbox was replaced and previous state is lost]\n"
UID_SLOT_SIZE = 4096 * 4  # uids per pool
_UID_FIRST = 10_000_000
_UID_SLOTS = ((1 << 31) - _UID_FIRST) // UID_SLOT_SIZE


def uid_lock_dir() -> str:
  return os.path.join(tempfile.gettempdir(), "rstar_code_pool_uids")


def claim_uid_range(lock_dir: str | None = None) -> tuple[int, int]:
  """(first uid, lock fd): the lowest range of UID_SLOT_SIZE sandbox uids no live pool on this
  host holds. Each range is a file in `lock_dir` under an exclusive flock held (fd open) for the
  pool's lifetime; the kernel drops it when the pool closes or its process dies."""
  lock_dir = lock_dir or uid_lock_dir()
  os.makedirs(lock_dir, mode=0o700, exist_ok=True)
  st = os.lstat(lock_dir)
  if not os.path.isdir(lock_dir) or os.path.islink(lock_dir) or st.st_uid != os.geteuid():
    raise RuntimeError(
      f"uid lock directory {lock_dir}: expected a directory owned by uid "
      f"{os.geteuid()}, got mode {oct(st.st_mode)} owner {st.st_uid}"
    )
  if st.st_mode & 0o022:
    raise RuntimeError(
      f"uid lock directory {lock_dir}: expected no group/world write, got "
      f"mode {oct(st.st_mode & 0o777)}"
    )
  dfd = os.open(lock_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
  try:
    for k in range(_UID_SLOTS):
      fd = os.open(str(k), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        os.close(fd)
        continue
      return _UID_FIRST + k * UID_SLOT_SIZE, fd
  finally:
    os.close(dfd)
  raise RuntimeError(f"no free sandbox uid range left in {lock_dir}")


def _kill_uid_range(lo: int, hi: int) -> None:
  """SIGKILLs every host process whose uid is in [lo, hi) (what a killed template left)."""
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
    except (OSError, ValueError):
      pass


# The memfds sent with each exec/func/session request (sandbox_template.CALL_FDS), and the
# request id that tags them on the fd socket.
_CALL_FDS = ("in", "code", "out", "err")
_RID = struct.Struct("<Q")


class _CallIO:
  """The memfds of one call (or one session): the host writes code and stdin, the call's
  process reads them and writes stdout/stderr, which the host reads. The template only passes
  the descriptors on (it checks output sizes, never contents), so no call's data ever sits in
  the template's heap, from which every later call is forked."""

  def __init__(self):
    self.fds: dict[str, int] = {}
    try:
      for name in _CALL_FDS:
        self.fds[name] = os.memfd_create(name, os.MFD_CLOEXEC)
    except BaseException:
      self.close()
      raise

  def load(self, code: bytes, stdin: bytes) -> None:
    for name, data in (("code", code), ("in", stdin)):
      fd = self.fds[name]
      os.ftruncate(fd, 0)
      view, off = memoryview(data), 0
      while off < len(view):
        off += os.pwrite(fd, view[off:], off)
    self.rewind()

  def rewind(self) -> None:
    """Empties the output and rewinds every offset (a shared file description: the call's
    process continues from here)."""
    for name in ("out", "err"):
      os.ftruncate(self.fds[name], 0)
    for fd in self.fds.values():
      os.lseek(fd, 0, os.SEEK_SET)

  def read(self, name: str, cap: int) -> bytes:
    fd = self.fds[name]
    return os.pread(fd, min(os.fstat(fd).st_size, cap), 0)

  def close(self) -> None:
    for fd in self.fds.values():
      os.close(fd)
    self.fds = {}


def _internal(msg: str, retryable: bool = False) -> dict:
  return {
    "local": True,  # made by the host: there is no call output to collect
    "status": "internal_error",
    "stdout": b"",
    "stderr": msg.encode(),
    "duration_s": 0.0,
    "exit_code": None,
    "retryable": retryable,
  }


class _Template:
  """Host-side handle of one template process; restarts it when it dies."""

  def __init__(self, pool: CodePool, index: int):
    self.pool = pool
    self.index = index
    self.proc: asyncio.subprocess.Process | None = None
    self.pending: dict[int, asyncio.Future] = {}
    self.reader: asyncio.Task | None = None
    self.ready = asyncio.Event()
    self.generation = 0
    self.inflight = 0
    self.restarts = 0
    self.restarting = False
    self.info: dict = {}
    self._write_lock = asyncio.Lock()
    self.fd_sock: socket.socket | None = None  # the call memfds go to the template over it
    self.cg_dirs: dict[str, str] = {}  # this start's cgroup directories (one per controller)
    self.last_seen = 0.0  # when the template last sent a frame (any reply or heartbeat)
    self.heartbeat: asyncio.Task | None = None
    self._cg_serial = 0

  @property
  def uid_range(self) -> tuple[int, int]:
    lo = self.pool._uid_base + self.index * self.pool.config.uids_per_template
    return lo, lo + self.pool.config.uids_per_template

  def _template_cfg(self) -> dict:
    c = self.pool.config
    level = self.pool.isolation_level
    lo, hi = self.uid_range
    user_env = {
      "PATH": "/usr/bin:/bin",
      "LANG": "C.UTF-8",
      "PYTHONIOENCODING": "utf-8",
      **_THREAD_ENV,
      **{k: "" for k in _HIDDEN_DEVICES},
    }
    scratch = "/tmp/code_pool" if level == "namespaces" else self.pool._scratch_dir(self.index)
    # Per-call network + IPC namespaces only where sockets are allowed (or nothing refuses
    # them): with the filter on and sockets off, SysV / message-queue IPC and sockets are
    # refused outright, so a call has no channel for those namespaces to cut.
    namespaced = level in ("namespaces", "pidns")
    call_ns = namespaced and (c.allow_sockets or not c.seccomp)
    return {
      "call_ns": call_ns,
      "use_seccomp": c.seccomp,
      "allow_subprocesses": c.allow_subprocesses,
      "allow_sockets": call_ns,
      # Without bubblewrap, make the interpreter readable by sandbox uids (e.g. under
      # /root, mode 700) in the template's own mount namespace; not at "rlimits".
      "expose_paths": _bwrap_binds(c) if level in ("pidns", "uid") else [],
      # Bound back read-only over a call's scratch where they lie under /tmp & co.
      "keep_paths": _bwrap_binds(c),
      "preload": tuple(c.preload),
      "warmup_code": c.warmup_code if c.preload else "",
      "template_env": dict(_THREAD_ENV),
      "user_env": user_env,
      "limits": {
        "memory_limit_mb": c.memory_limit_mb,
        "scratch_bytes": c.scratch_bytes,
        "max_output_bytes": c.max_output_bytes,
        "max_procs": c.max_procs,
        "max_open_files": c.max_open_files,
      },
      "pidns": level in ("namespaces", "pidns"),
      "drop_uid": level != "rlimits",
      "uid_lo": lo,
      "uid_hi": hi,
      "scratch_root": scratch,
      "session_cpu_s": c.session_timeout_cpu_s,
      "fd_sock": -1,  # set at start
    }

  @property
  def userns_root(self) -> int:
    """The host uid of this template's user-namespace root: in the spare block of the pool's
    uid range, past every template's sandbox uids (the pool checks the block exists)."""
    c = self.pool.config
    return self.pool._uid_base + self.pool._n_templates * c.uids_per_template + self.index

  def userns_argv(self, python_args: list[str]) -> list[str]:
    """The launcher (host root, outside bubblewrap), then bubblewrap and the interpreter."""
    c = self.pool.config
    lo, hi = self.uid_range
    ids = f"0 {self.userns_root} 1\n{lo} {lo} {hi - lo}\n"
    spec = json.dumps({"uid_map": ids, "gid_map": ids, "expose": _bwrap_binds(c)})
    inner = _bwrap_argv(c) + ["--", _sandbox_python(c), *python_args]
    return [c.python, "-I", "-B", _TEMPLATE_PATH, "--userns-launch", spec, *inner]

  async def start(self) -> None:
    c = self.pool.config
    argv = [c.python, "-I", "-B", _TEMPLATE_PATH]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **_THREAD_ENV}
    if self.pool._userns:
      argv = self.userns_argv(argv[1:])
    elif self.pool.isolation_level == "namespaces":
      argv = _bwrap_argv(c) + ["--", _sandbox_python(c)] + argv[1:]
    if self.fd_sock is not None:
      self.fd_sock.close()
    self.fd_sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    self.fd_sock.setblocking(False)
    cg_fds = {}
    try:
      if self.pool._cg is not None:
        self._cg_serial += 1
        self.cg_dirs = self.pool._cg.template_dirs(
          f"t{self.index}_{self._cg_serial}", self.userns_root if self.pool._userns else None
        )
        for ctl, d in self.cg_dirs.items():
          cg_fds[ctl] = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
      self.proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,
        close_fds=True,
        pass_fds=(theirs.fileno(), *cg_fds.values()),
      )
    finally:
      theirs_fd = theirs.fileno()
      theirs.close()
      for fd in cg_fds.values():
        os.close(fd)
    cfg = self._template_cfg()
    cfg["fd_sock"] = theirs_fd  # bubblewrap keeps inherited descriptors at their numbers
    if cg_fds:
      cfg["cgroup"] = {"version": self.pool._cg.version, "fds": cg_fds}
    self.proc.stdin.write(wire.frame(cfg))
    await self.proc.stdin.drain()
    try:
      self.info = await asyncio.wait_for(self._read_frame(), c.startup_timeout_s)
      wire.check_record(self.info, {"ready": bool, "import_error": str}, "template start")
      if self.info["import_error"]:
        raise RuntimeError(
          f"isolation {self.pool.isolation_level!r}: a sandbox uid cannot read the Python "
          f"install ({self.info['import_error']}; {self.info.get('exposed') or 'nothing exposed'}"
          "): make it world-readable (chmod o+rx on its parent directories), or use the "
          "namespaces level (bubblewrap)"
        )
    except BaseException:
      self._kill()
      raise
    if self.info.get("hardening_failed"):
      log.warning(
        "code pool template %d: hardening incomplete: %s", self.index, self.info["hardening_failed"]
      )
    self.generation += 1
    self.reader = asyncio.create_task(self._read_loop())
    self.last_seen = time.monotonic()
    if self.heartbeat is None or self.heartbeat.done():
      self.heartbeat = asyncio.create_task(self._heartbeat())
    self.restarting = False
    self.ready.set()
    log.info(
      "code pool template %d ready (pid %s, preloaded %s in %.2fs, %d MiB of heap in 2 MiB pages)",
      self.index,
      self.proc.pid,
      self.info.get("preloaded"),
      self.info.get("startup_s", 0.0),
      self.info.get("huge_page_bytes", 0) >> 20,
    )

  async def _read_frame(self) -> dict:
    # Bounded: a reply holds at most two capped streams plus a few small fields.
    limit = 2 * self.pool.config.max_output_bytes + (1 << 16)
    n = wire.frame_length(await self.proc.stdout.readexactly(4), limit)
    return wire.decode(await self.proc.stdout.readexactly(n))

  async def _read_loop(self) -> None:
    try:
      while True:
        msg = _check_reply(await self._read_frame(), self.pool.config.max_output_bytes)
        self.last_seen = time.monotonic()
        fut = self.pending.pop(msg.pop("rid"), None)
        if fut is not None and not fut.done():
          fut.set_result(msg)
    except (asyncio.IncompleteReadError, ConnectionError, EOFError):
      pass
    except wire.WireError as e:
      self._on_death(f"the sandbox template sent a malformed frame ({e})")
      return
    except asyncio.CancelledError:
      return
    self._on_death("the sandbox template process died")

  def _on_death(self, why: str) -> None:
    pending, self.pending = self.pending, {}
    for fut in pending.values():
      if not fut.done():
        fut.set_result(_internal(why + "\n", retryable=True))
    if self.restarting:
      return  # this death is already being handled
    self.restarting = True
    self.ready.clear()
    self.generation += 1  # sessions pinned to the dead process are gone
    self._kill()
    if not self.pool._closing:
      self.restarts += 1
      log.warning("code pool template %d: %s; restarting", self.index, why)
      self.pool._spawn(self._restart())

  async def _restart(self) -> None:
    delay = 0.1
    while not self.pool._closing:
      try:
        await self.start()
        return
      except Exception as e:  # keep trying: a pool that cannot start answers internal_error
        log.error("code pool template %d failed to restart: %r", self.index, e)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)

  def _kill(self) -> None:
    if self.reader is not None and self.reader is not asyncio.current_task():
      self.reader.cancel()
    if self.proc is not None and self.proc.returncode is None:
      try:
        os.killpg(self.proc.pid, signal.SIGKILL)
      except OSError:
        pass
    if self.proc is not None:
      self._kill_leftovers()
      self.pool._spawn(self._reap(self.proc, self.cg_dirs))
      self.cg_dirs = {}

  def _kill_leftovers(self) -> None:
    """Without bubblewrap nothing else ends the template's calls: kill its uids from here;
    and, at every level with cgroups, whatever is in its calls' cgroups."""
    if self.pool.isolation_level in ("pidns", "uid"):
      _kill_uid_range(*self.uid_range)
    for d in self.cg_dirs.values():
      for pid in cgroups.tree_pids(d):
        try:
          os.kill(pid, signal.SIGKILL)
        except OSError:
          pass

  def send_nowait(self, req: dict) -> None:
    """Queues a request whose reply nobody awaits (safe inside a cancellation handler)."""
    if self.proc is None or self.proc.returncode is not None or not self.ready.is_set():
      return
    req["rid"] = next(self.pool._rids)
    try:
      self.proc.stdin.write(wire.frame(req))
    except (ConnectionError, RuntimeError, AttributeError):
      pass

  async def _reap(self, proc, cg_dirs=None) -> None:
    try:
      await asyncio.wait_for(proc.wait(), 10)
    except (TimeoutError, ProcessLookupError):
      pass
    for _ in range(100):  # the dead template's cgroups, once their last process is reaped
      if not cg_dirs or self.pool._cg is None:
        break
      for d in cg_dirs.values():
        for pid in cgroups.tree_pids(d):
          try:
            os.kill(pid, signal.SIGKILL)
          except OSError:
            pass
      if all(cgroups.remove_tree(d) for d in cg_dirs.values()):
        break
      await asyncio.sleep(0.05)

  def _reply_waiting(self) -> bool:
    """Whether reply bytes already sit in the pipe or the reader's buffer (a stalled host
    loop, not a dead template, made the wait run out)."""
    if self.proc is None or self.proc.stdout is None:
      return False
    if getattr(self.proc.stdout, "_buffer", None):
      return True
    transport = self.proc._transport.get_pipe_transport(1) if self.proc._transport else None
    fd = transport.get_extra_info("pipe").fileno() if transport is not None else None
    if fd is None:
      return False
    try:
      return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
      return False

  async def _await_reply(self, fut: asyncio.Future, timeout: float | None) -> dict:
    """The reply, or TimeoutError when the template is wedged. Before declaring it so, what is
    already in the pipe is read: after a host stall the deadline and the reply come due in
    the same loop turn, and the timer must not win."""
    try:
      return await asyncio.wait_for(asyncio.shield(fut), timeout)
    except TimeoutError:
      for _ in range(64):  # each round: the reader consumed at least one more chunk
        if fut.done():
          return fut.result()
        if not self._reply_waiting():
          break
        try:
          return await asyncio.wait_for(asyncio.shield(fut), 1.0)
        except TimeoutError:
          continue
      if fut.done():
        return fut.result()
      raise

  @property
  def _heartbeat_s(self) -> float:
    return min(2.0, self.pool.config.reply_grace_s / 4)

  def _alive(self) -> bool:
    """Whether the template answered within the grace (its heartbeat: independent of calls)."""
    late = time.monotonic() - self.last_seen
    return late <= self.pool.config.reply_grace_s + self._heartbeat_s or self._reply_waiting()

  async def _heartbeat(self) -> None:
    """Pings the template every few seconds whatever its calls do: a template is dead when it
    stops answering these, never because one call's process outlived its deadline."""
    while not self.pool._closing:
      await asyncio.sleep(self._heartbeat_s)
      if not self.ready.is_set() or self.restarting:
        continue
      if not self._alive():
        self._on_death("the sandbox template stopped answering its heartbeat")
        continue
      self.send_nowait({"kind": "ping"})

  async def _settle(self, fut: asyncio.Future, rid: int, timeout, on_done) -> None:
    """A caller gave up on a call that still runs: keep its worker slot until it ends."""
    try:
      await self._await_reply(fut, timeout)
    except TimeoutError:
      if not self._alive():
        self._on_death("the sandbox template stopped answering")
    except asyncio.CancelledError:
      pass
    finally:
      self.pending.pop(rid, None)
      on_done()

  async def request(
    self, req: dict, timeout: float | None, on_cancel=None, io: _CallIO | None = None
  ) -> dict:
    """Sends `req` (with `io`'s memfds for a call) and awaits the reply; a call's reply comes
    back with the output the host read from `io` (after the session note, if any)."""
    msg = await self._request(req, timeout, on_cancel, io)
    if io is None or msg.get("local") or "status" not in msg:
      return msg
    cap = self.pool.config.max_output_bytes
    msg["stdout"] = io.read("out", cap) + msg["stdout"]
    msg["stderr"] = req.get("note", b"") + io.read("err", cap) + msg["stderr"]
    return msg

  async def _request(self, req: dict, timeout: float | None, on_cancel, io) -> dict:
    try:
      await asyncio.wait_for(self.ready.wait(), self.pool.config.startup_timeout_s)
    except TimeoutError:
      return _internal("no sandbox template available (it keeps failing to start)\n")
    rid = next(self.pool._rids)
    req["rid"] = rid
    if req["kind"] == "session":
      # Decided when the request is actually sent (after any restart): whether the session's
      # interpreter is gone, and where it lives from now on (for close_session and later calls).
      known = self.pool._sessions.get(req["session_id"])
      if known is not None and known != (self.index, self.generation) and not req.get("note"):
        req["note"] = _RESTART_NOTE
      self.pool._sessions[req["session_id"]] = (self.index, self.generation)
    fut = asyncio.get_running_loop().create_future()
    self.pending[rid] = fut
    try:
      async with self._write_lock:
        if io is not None:
          # Before the request, so the template finds them queued when it reads it.
          socket.send_fds(self.fd_sock, [_RID.pack(rid)], [io.fds[n] for n in _CALL_FDS])
        self.proc.stdin.write(wire.frame({k: v for k, v in req.items() if k != "note"}))
        await self.proc.stdin.drain()
    except (OSError, RuntimeError, AttributeError) as e:
      self.pending.pop(rid, None)
      self._on_death(f"could not reach the sandbox template: {e!r}")
      return _internal(f"could not reach the sandbox template: {e!r}\n", retryable=True)
    settling = False
    try:
      return await self._await_reply(fut, timeout)
    except TimeoutError:
      if self._alive():
        # The template answers its heartbeat: the call's process outlived its kill (held in
        # the kernel). Only this call gives up; the template reclaims it when it ends, and
        # no other call or session is touched.
        return _internal(
          "the call did not end within its timeout and the grace after its kill (its process "
          "is held in the kernel); the sandbox is alive and reclaims it when it ends\n"
        )
      # Silent past the grace, heartbeat included: the template itself is wedged.
      self._on_death("the sandbox template stopped answering")
      return _internal("the sandbox template stopped answering\n", retryable=True)
    except asyncio.CancelledError:
      if on_cancel is not None:
        settling = True
        self.pool._spawn(self._settle(fut, rid, timeout, on_cancel))
      raise
    finally:
      if not settling:
        self.pending.pop(rid, None)

  async def shutdown(self) -> None:
    self.ready.clear()
    if self.heartbeat is not None:
      self.heartbeat.cancel()
    if self.proc is None:
      return
    try:
      if self.proc.returncode is None:
        self.proc.stdin.write(wire.frame({"kind": "shutdown"}))
        await self.proc.stdin.drain()
        self.proc.stdin.close()
        await asyncio.wait_for(self.proc.wait(), 10)
    except (TimeoutError, ConnectionError, RuntimeError):
      pass
    if self.reader is not None:
      self.reader.cancel()
    if self.fd_sock is not None:
      self.fd_sock.close()
      self.fd_sock = None
    pending, self.pending = self.pending, {}
    for fut in pending.values():  # nobody will answer them now
      if not fut.done():
        fut.set_result(_internal("the code pool is closing\n"))
    if self.proc.returncode is None:
      try:
        os.killpg(self.proc.pid, signal.SIGKILL)
      except OSError:
        pass
      await self._reap(self.proc)


class BatchExecuteMixin:
  """`execute_many` for anything with the pool's `execute` (CodePool, CodePoolClient, RayCodePool)."""

  async def execute_many(self, requests: Iterable[Mapping[str, Any]]) -> list[ExecResult]:
    """Runs each {"code", "stdin"?, "timeout_s"?, "session_id"?} concurrently, in order."""
    reqs = list(requests)
    for i, r in enumerate(reqs):
      if "code" not in r:
        raise ValueError(f"execute_many: request {i} has no 'code' field (keys: {sorted(r)})")
    return list(
      await asyncio.gather(
        *(
          self.execute(r["code"], r.get("stdin", ""), r.get("timeout_s"), r.get("session_id"))
          for r in reqs
        )
      )
    )


class CodePool(BatchExecuteMixin):
  """Sandboxed Python execution pool (see module docstring). Use as `async with CodePool()`."""

  def __init__(self, num_workers: int = 4, *, config: PoolConfig | None = None, **overrides):
    if config is None:
      config = PoolConfig(num_workers=num_workers, **overrides)
    elif overrides:
      config = dataclasses.replace(config, **overrides)
    self.config = config
    self.isolation_level: str | None = None
    self._templates: list[_Template] = []
    self._sem: asyncio.Semaphore | None = None
    self._rids = itertools.count(1)
    self._sessions: dict[str, tuple[int, int]] = {}
    self._session_io: dict[str, _CallIO] = {}
    self._session_locks: dict[str, asyncio.Lock] = {}
    self._closing = False
    self._tasks: set[asyncio.Task] = set()
    self._tmpdir: str | None = None
    self._uid_base = config.uid_base if config.uid_base is not None else _UID_FIRST
    self._uid_lock: int | None = None
    # Session bookkeeping: last use (oldest first, for LRU eviction and the idle TTL), and why
    # a session id was closed by the pool (its next call says so).
    self._session_used: collections.OrderedDict[str, float] = collections.OrderedDict()
    self._evicted: collections.OrderedDict[str, str] = collections.OrderedDict()
    self._max_sessions = config.max_sessions
    self._expiry: asyncio.Task | None = None
    self.stats = {"calls": 0, "queue_timeouts": 0, "sessions_evicted": 0}
    self._cg: cgroups.PoolCgroups | None = None
    self.memory_bound = "not started"  # what bounds a call's memory (see `_setup_cgroups`)
    self.template_privilege = "not started"  # what an escape into a template holds
    self._userns = False
    self._n_templates = 0

  # -- lifecycle
  async def start(self) -> CodePool:
    c = self.config
    loop = asyncio.get_running_loop()
    self.isolation_level = await loop.run_in_executor(None, detect_isolation, c)
    n = c.num_templates or max(1, min(c.num_workers, os.cpu_count() or 1))
    if (n + 1) * c.uids_per_template > UID_SLOT_SIZE:
      raise ValueError(f"{n} templates x {c.uids_per_template} uids exceed the pool's uid range")
    # Before anything is claimed (uid range, scratch dir): a "required" refusal leaves nothing.
    self._setup_cgroups()
    if c.uid_base is None and self.isolation_level != "rlimits":
      self._uid_base, self._uid_lock = claim_uid_range()
    if self._max_sessions is None:
      self._max_sessions = max(1, n * c.uids_per_template // 2)
    self._n_templates = n
    try:
      await loop.run_in_executor(None, self._setup_userns)
    except BaseException:
      await self.close()  # gives back the cgroups and the uid range taken above
      raise
    if self.isolation_level != "namespaces":
      self._tmpdir = tempfile.mkdtemp(prefix="code_pool_")
      os.chmod(self._tmpdir, 0o711)
    # INFO at the strongest level there is; WARNING only when this is a fallback.
    log.log(
      logging.INFO if self.isolation_level == ISOLATION_LEVELS[0] else logging.WARNING,
      "CodePool isolation level: %s (%s; memory: %s; template: %s)%s",
      self.isolation_level,
      self.isolation_description,
      self.memory_bound,
      self.template_privilege,
      "" if self.isolation_level == ISOLATION_LEVELS[0] else " (a fallback: not the strongest)",
    )
    if c.allow_sockets and self.isolation_level not in ("namespaces", "pidns"):
      log.warning(
        "CodePool allow_sockets=True has no effect at level %s: sockets stay refused (no "
        "per-call network namespace to contain them)",
        self.isolation_level,
      )
    self._sem = asyncio.Semaphore(c.num_workers)
    self._templates = [_Template(self, i) for i in range(n)]
    try:
      await asyncio.gather(*(t.start() for t in self._templates))
    except BaseException:
      await self.close()
      raise
    if c.session_idle_ttl_s is not None:
      self._expiry = asyncio.ensure_future(self._expire_idle_sessions(c.session_idle_ttl_s))
    return self

  @property
  def isolation_description(self) -> str:
    d = _DESCRIPTIONS.get(self.isolation_level or "", "not started")
    if self.config.allow_sockets and self.isolation_level in ("namespaces", "pidns"):
      d = d.replace("per-call PID namespace", "per-call PID/net/IPC namespaces")
      d = d.replace("seccomp (no sockets)", "seccomp (sockets inside the call's own network)")
    return d

  def _setup_userns(self) -> None:
    """Whether templates start in a user namespace of their own (namespaces level only): a
    probe runs the launcher, bubblewrap and a check inside (uid 0 there, a mapped sandbox uid
    reachable, a PID namespace made). `template_privilege` says what an escape would hold."""
    c = self.config
    self._userns = False
    if self.isolation_level != "namespaces" or c.template_userns == "off":
      self.template_privilege = "the host's root" if _is_root() else "the host's uid"
      if self.isolation_level == "namespaces":
        self.template_privilege += " (template_userns off)"
      return
    probe = _Template(self, 0)
    lo = probe.uid_range[0]
    code = (
      "import ctypes,os,sys;l=ctypes.CDLL(None,use_errno=True);"
      "assert os.getuid()==0 and len(open('/proc/self/uid_map').read().split())==6;"
      f"p=os.fork()\nif p==0:\n os.setgroups([]);os.setresgid({lo},{lo},{lo});"
      f"os.setresuid({lo},{lo},{lo});os._exit(0)\n"
      "assert os.waitpid(p,0)[1]==0 and l.unshare(0x20000000)==0"
    )
    argv = probe.userns_argv(["-I", "-c", code])
    key = (c.python, tuple(_bwrap_binds(c)))
    why = _USERNS_PROBED.get(key)
    if why is None:  # once per process and install: what it checks is the kernel's, not the pool's
      try:
        r = subprocess.run(
          argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, start_new_session=True
        )
        why = "" if r.returncode == 0 else r.stderr.decode(errors="replace").strip()[-300:]
        why = why or ("" if r.returncode == 0 else f"exit status {r.returncode}")
      except (OSError, subprocess.SubprocessError) as e:
        why = str(e)
      _USERNS_PROBED[key] = why
    if why:
      if c.template_userns == "required":
        raise RuntimeError(f"PoolConfig.template_userns='required' but the probe failed: {why}")
      log.warning("CodePool: templates run as the host's root (no user namespace: %s)", why)
      self.template_privilege = f"the host's root (no user namespace: {why.splitlines()[-1]})"
      return
    self._userns = True
    self.template_privilege = (
      f"root of its own user namespace = host uid {probe.userns_root}.. (one per template), "
      "sandbox uids mapped 1:1"
    )

  def _setup_cgroups(self) -> None:
    """The pool's cgroup directories, or why there are none (`memory_bound` says which)."""
    c = self.config
    if c.cgroups == "off":
      self.memory_bound = "RLIMIT_AS only (cgroups off by config)"
      return
    version, dirs = cgroups.find()
    why = dirs if not version else ""
    if version:
      try:
        self._cg = cgroups.PoolCgroups(version, dirs, f"{next(_POOL_SERIAL)}")
      except OSError as e:
        why = f"cgroup v{version} not writable ({e.filename}: {e.strerror})"
    if self._cg is None:
      if c.cgroups == "required":
        raise RuntimeError(f"PoolConfig.cgroups='required' but {why}")
      self.memory_bound = f"RLIMIT_AS only, a lower level: {why}"
      log.warning("CodePool: no memory + pids cgroup per call: %s", why)
      return
    self.memory_bound = (
      f"cgroup v{version} per call (memory {c.memory_limit_mb} MiB incl. kernel memory, "
      f"{c.max_procs} tasks) + RLIMIT_AS"
    )

  def _scratch_dir(self, index: int) -> str:
    return os.path.join(self._tmpdir, f"t{index}")

  async def close(self) -> None:
    self._closing = True
    if self._expiry is not None:
      self._expiry.cancel()
    await asyncio.gather(*(t.shutdown() for t in self._templates), return_exceptions=True)
    if self._tasks:  # reaping of replaced templates: let it finish rather than orphan it
      await asyncio.wait(list(self._tasks), timeout=5)
    for task in list(self._tasks):
      task.cancel()
    if self._tmpdir:
      wire.rmtree(self._tmpdir)  # iterative: a call's 10,000-deep tree cannot make this raise
    for sid in list(self._session_io):
      self._drop_session_io(sid)
    if self._cg is not None:
      self._cg.close()
      self._cg = None
    if self._uid_lock is not None:
      os.close(self._uid_lock)  # every process of the range is gone: give the range back
      self._uid_lock = None

  async def __aenter__(self) -> CodePool:
    return await self.start()

  async def __aexit__(self, *exc) -> None:
    await self.close()

  def _spawn(self, coro) -> None:
    task = asyncio.ensure_future(coro)
    self._tasks.add(task)
    task.add_done_callback(self._tasks.discard)

  # -- scheduling
  def _pick(self) -> _Template:
    alive = [t for t in self._templates if t.ready.is_set()] or self._templates
    return min(alive, key=lambda t: t.inflight)

  async def _acquire(self, queue_timeout_s: float | None) -> None:
    if self._sem is None or self._closing:
      raise RuntimeError("CodePool is not running: use `async with CodePool(...)` or start()")
    timeout = queue_timeout_s if queue_timeout_s is not None else self.config.queue_timeout_s
    if timeout is not None:
      timeout = check_seconds("queue_timeout_s", timeout, MAX_QUEUE_TIMEOUT_S, allow_zero=True)
    if timeout is None:
      await self._sem.acquire()
      return
    if timeout == 0:  # "only if a worker is free now"
      if self._sem.locked():
        self.stats["queue_timeouts"] += 1
        raise QueueTimeout("no sandbox worker free now (queue_timeout_s=0)")
      await self._sem.acquire()  # free now: returns at once
      return
    try:
      await asyncio.wait_for(self._sem.acquire(), timeout)
    except TimeoutError:
      self.stats["queue_timeouts"] += 1
      raise QueueTimeout(f"no sandbox worker free within {timeout:.1f}s") from None

  async def _run(
    self,
    tpl: _Template | None,
    req: dict,
    timeout_s: float,
    queue_timeout_s: float | None,
    io: _CallIO | None = None,
  ) -> dict:
    await self._acquire(queue_timeout_s)
    if tpl is None:
      tpl = self._pick()  # after the wait, so the least busy template at start time gets it
    held = [True]  # the worker slot; a cancelled call hands it to its settle task

    def release_later(t=None):
      if t is not None:
        t.inflight -= 1
      self._sem.release()

    try:
      for attempt in range(2):
        tpl.inflight += 1
        if attempt:
          io.rewind()  # a dead attempt's partial output is not this call's
        try:
          msg = await tpl.request(
            dict(req),
            timeout_s + self.config.reply_grace_s,
            on_cancel=lambda t=tpl: release_later(t),
            io=io,
          )
        except asyncio.CancelledError:
          held[0] = False  # the call still runs in the sandbox: its slot frees when it ends
          raise
        finally:
          if held[0]:
            tpl.inflight -= 1
        # The template itself died (infrastructure, not the user's code): retry once on its
        # replacement. A session then starts fresh and says so.
        if not msg.get("retryable") or attempt or self._closing:
          return msg
        if req["kind"] == "session":
          tpl, req["note"] = self._session_template(req["session_id"])
        else:
          tpl = self._pick()
      return msg
    finally:
      if held[0]:
        self._sem.release()

  # -- public API
  async def execute(
    self,
    code: str,
    stdin: str = "",
    timeout_s: float | None = None,
    session_id: str | None = None,
    *,
    queue_timeout_s: float | None = None,
  ) -> ExecResult:
    """Runs `code` with `stdin`; never raises for anything the code does."""
    try:
      return await self._execute(code, stdin, timeout_s, session_id, queue_timeout_s)
    except QueueTimeout as e:
      return ExecResult("internal_error", "", f"queue_timeout: {e}\n", 0.0)

  async def _execute(self, code, stdin, timeout_s, session_id, queue_timeout_s) -> ExecResult:
    """Like `execute` but raises QueueTimeout (the HTTP service reports it distinctly)."""
    if not isinstance(code, str):
      raise TypeError(f"code must be str, got {type(code).__name__}")
    if not isinstance(stdin, (str, bytes)):
      raise TypeError(f"stdin must be str or bytes, got {type(stdin).__name__}")
    timeout = check_seconds(
      "timeout_s", timeout_s if timeout_s is not None else self.config.timeout_s, MAX_TIMEOUT_S
    )
    if queue_timeout_s is not None:
      check_seconds("queue_timeout_s", queue_timeout_s, MAX_QUEUE_TIMEOUT_S, allow_zero=True)
    stdin_b = stdin.encode("utf-8", "surrogateescape") if isinstance(stdin, str) else stdin
    if len(code) > MAX_CODE_BYTES or len(stdin_b) > MAX_CODE_BYTES:
      raise ValueError(
        f"code and stdin must each be <= {MAX_CODE_BYTES} bytes, got {len(code)} and {len(stdin_b)}"
      )
    self.stats["calls"] += 1
    req = {"kind": "exec", "timeout_s": timeout}
    code_b = code.encode("utf-8", "surrogatepass")
    if session_id is not None:
      if not isinstance(session_id, str) or not 0 < len(session_id) <= 1024:
        raise ValueError(
          f"session_id must be a non-empty str of <= 1024 chars, got "
          f"{type(session_id).__name__} of length {len(str(session_id))}"
        )
      req["kind"] = "session"
      req["session_id"] = session_id
      # One call at a time per session, in arrival order (a session is one interpreter).
      lock = self._session_locks.setdefault(session_id, asyncio.Lock())
      async with lock:
        tpl, req["note"] = self._session_template(session_id)
        self._touch(session_id)
        io = self._session_io.get(session_id)
        if io is None:
          io = self._session_io[session_id] = _CallIO()
        io.load(code_b, stdin_b)  # the interpreter is stopped between calls
        try:
          msg = await self._run(tpl, req, timeout, queue_timeout_s, io)
        except asyncio.CancelledError:
          self._abort_session(session_id)
          raise
        finally:
          if session_id in self._sessions:
            self._touch(session_id)
      return self._result(msg)
    io = _CallIO()
    try:
      io.load(code_b, stdin_b)
      msg = await self._run(None, req, timeout, queue_timeout_s, io)
    finally:
      io.close()  # the template and the call hold their own references while they need them
    return self._result(msg)

  @staticmethod
  def _result(msg: dict) -> ExecResult:
    return ExecResult(
      status=msg["status"],
      stdout=msg["stdout"].decode("utf-8", "replace"),
      stderr=msg["stderr"].decode("utf-8", "replace"),
      duration_s=float(msg["duration_s"]),
      exit_code=msg.get("exit_code"),
    )

  def _session_template(self, sid: str) -> tuple[_Template, bytes]:
    known = self._sessions.get(sid)
    if known is not None:
      tpl = self._templates[known[0]]
      if tpl.generation == known[1]:
        return tpl, b""
    tpl = self._pick()
    self._make_room(tpl, sid)
    self._sessions[sid] = (tpl.index, tpl.generation)
    reason = self._evicted.pop(sid, None)
    if reason is not None:
      note = f"[session {reason}: previous state is lost]\n".encode()
    else:
      note = b"" if known is None else _RESTART_NOTE
    return tpl, note

  def _live_sessions(self) -> list[str]:
    return [sid for sid, (i, g) in self._sessions.items() if self._templates[i].generation == g]

  def _idle(self, sid: str) -> bool:
    lock = self._session_locks.get(sid)
    return lock is None or not lock.locked()

  def _make_room(self, tpl: _Template, new_sid: str) -> None:
    """Before a new session starts on `tpl`: evict least recently used idle sessions while the
    pool is at `max_sessions` or `tpl` would have no uid left for plain calls."""
    per_tpl = max(1, self.config.uids_per_template - self.config.num_workers - 1)
    live = [x for x in self._live_sessions() if x != new_sid]
    on_tpl = {x for x in live if self._sessions[x][0] == tpl.index}
    while len(live) >= self._max_sessions or len(on_tpl) >= per_tpl:
      scope = set(live) if len(live) >= self._max_sessions else on_tpl
      victim = next((x for x in self._session_used if x in scope and self._idle(x)), None)
      if victim is None:
        victim = next((x for x in scope if self._idle(x)), None)
      if victim is None:
        return  # every one is mid-call; the template answers internal_error if out of uids
      self._evict(
        victim,
        f"evicted (the pool holds at most {self._max_sessions} sessions, "
        f"{per_tpl} per template; this one was the least recently used)",
      )
      live.remove(victim)
      on_tpl.discard(victim)

  def _evict(self, sid: str, reason: str) -> None:
    """Closes an idle session now (the close is queued before any later request to its
    template); its next call starts fresh with `reason` in a note."""
    known = self._sessions.pop(sid, None)
    self._session_locks.pop(sid, None)
    self._session_used.pop(sid, None)
    self._drop_session_io(sid)
    self._evicted[sid] = reason
    while len(self._evicted) > 65536:
      self._evicted.popitem(last=False)
    self.stats["sessions_evicted"] += 1
    if known is not None:
      tpl = self._templates[known[0]]
      if tpl.generation == known[1]:
        tpl.send_nowait({"kind": "close_session", "session_id": sid})

  def _touch(self, sid: str) -> None:
    self._session_used[sid] = time.monotonic()
    self._session_used.move_to_end(sid)

  async def _expire_idle_sessions(self, ttl: float) -> None:
    while not self._closing:
      await asyncio.sleep(min(max(ttl / 4, 0.05), 30.0))
      now = time.monotonic()
      for sid, used in list(self._session_used.items()):
        if now - used < ttl:
          break  # oldest first: the rest were used more recently
        if self._idle(sid):
          self._evict(sid, f"expired after {ttl:g} s idle")

  def _abort_session(self, sid: str) -> None:
    """A caller gave up on a session call: its interpreter is mid-call in an unknown state, so
    it is killed (queued before any later request to that template) and the next call on this
    id starts fresh, saying so."""
    known = self._sessions.get(sid)
    if known is None:
      return
    tpl = self._templates[known[0]]
    if tpl.generation == known[1]:
      tpl.send_nowait({"kind": "abort_session", "session_id": sid})
    self._sessions[sid] = (known[0], -1)  # forces the "session restarted" note next time

  async def close_session(self, session_id: str) -> bool:
    """Kills the session's interpreter; returns whether it was alive."""
    if not isinstance(session_id, str) or not 0 < len(session_id) <= 1024:
      raise ValueError(f"session_id must be a non-empty str of <= 1024 chars, got {session_id!r}")
    lock = self._session_locks.get(session_id)
    if lock is not None:
      async with lock:  # after any call already queued on it
        return await self._close_session(session_id)
    return await self._close_session(session_id)

  def _drop_session_io(self, sid: str) -> None:
    io = self._session_io.pop(sid, None)
    if io is not None:
      io.close()

  async def _close_session(self, session_id: str) -> bool:
    self._drop_session_io(session_id)
    known = self._sessions.pop(session_id, None)
    self._session_locks.pop(session_id, None)
    self._session_used.pop(session_id, None)
    self._evicted.pop(session_id, None)
    if known is None:
      return False
    tpl = self._templates[known[0]]
    if tpl.generation != known[1] or not tpl.ready.is_set():
      return False
    msg = await tpl.request({"kind": "close_session", "session_id": session_id}, 30.0)
    return bool(msg.get("closed"))

  async def run_function(self, fn: Callable, *args, timeout_s: float = 5.0, **kwargs) -> Any:
    """Runs module-level `fn(*args, **kwargs)` in a fresh sandboxed worker; returns its value.

    Raises FunctionRunError (status timeout / memory_limit / error / ...) when it fails.
    """
    timeout = check_seconds("timeout_s", timeout_s, MAX_TIMEOUT_S)
    try:
      # Pickle goes host -> sandbox only (the host trusts its own bytes); the result comes back
      # as plain `wire` values, never unpickled.
      payload = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
      raise TypeError(
        f"run_function needs a module-level picklable callable and arguments: {e}"
      ) from e
    req = {
      "kind": "func",
      "timeout_s": timeout,
      "sys_path": [p for p in sys.path if p and os.path.isdir(p)],
    }
    io = _CallIO()
    try:
      io.load(payload, b"")
      del payload
      msg = await self._run(None, req, timeout, None, io)
    finally:
      io.close()
    stderr = msg["stderr"].decode("utf-8", "replace")
    if msg["status"] != "ok":
      raise FunctionRunError(msg["status"], stderr[-2000:])
    try:
      record = wire.decode(msg["stdout"])
      if type(record) is not list or len(record) != 2 or type(record[0]) is not bool:
        raise wire.WireError("not a [ok, value] record")
    except wire.WireError as e:
      raise FunctionRunError("error", f"bad result record ({e}); stderr: {stderr[-1000:]}") from e
    good, value = record
    if not good:
      raise FunctionRunError("error", value if isinstance(value, str) else repr(value))
    return value

  async def ping(self) -> list[dict]:
    """Round trip to every template (health check)."""
    return list(await asyncio.gather(*(t.request({"kind": "ping"}, 30.0) for t in self._templates)))
