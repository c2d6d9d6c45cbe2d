"""Warm template process: preloads modules once, then forks one isolated child per call.

Runs as a standalone script (stdlib only, plus the modules it is told to preload) so it can
start inside a bubblewrap sandbox that sees only a read-only view of the Python install and
the project. The host (`code_pool.py`) talks to it over fd 0/1 with length-prefixed pickle
frames; the template never runs user code itself, so user code cannot reach those pipes.

Per call (see `_start_child`):
  template --fork--> leader (setsid; PID 1 of a fresh PID namespace when available)
  leader   --fork--> user process (rlimits, unprivileged per-slot uid, scrubbed env, scratch dir)
Killing the leader makes the kernel kill everything in its PID namespace, including double-forked
`setsid` escapees. Without PID namespaces the template kills every process of the slot's uid.

stdout/stderr go to memfds whose size is capped by RLIMIT_FSIZE, so a child that prints
gigabytes is stopped by the kernel (SIGXFSZ/EFBIG) and neither the template nor the host ever
holds more than the cap.
"""
import ast
import builtins
import ctypes
import gc
import io
import linecache
import os
import pickle
import resource
import selectors
import shutil
import signal
import struct
import sys
import time
import traceback

CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
# Exit code the executor uses for an uncaught MemoryError (reported as status memory_limit).
MEMORY_EXIT_CODE = 247
USER_FILENAME = "<code>"

_libc = ctypes.CDLL(None, use_errno=True)


# ---------------------------------------------------------------------------------------------
# framing
def _read_exact(fd, n):
  chunks, got = [], 0
  while got < n:
    b = os.read(fd, n - got)
    if not b:
      raise EOFError
    chunks.append(b)
    got += len(b)
  return b"".join(chunks)


def read_frame(fd):
  (n,) = struct.unpack("<I", _read_exact(fd, 4))
  return pickle.loads(_read_exact(fd, n))


def write_frame(fd, obj):
  data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
  view = memoryview(struct.pack("<I", len(data)) + data)
  while view:
    n = os.write(fd, view)
    view = view[n:]


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
  # closefd=False: the fds belong to the process, a new wrapper per call must not close them.
  sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                               encoding="utf-8", errors="replace")
  sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                                encoding="utf-8", errors="backslashreplace", write_through=False)
  sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                encoding="utf-8", errors="backslashreplace", write_through=True)


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
  except MemoryError as e:
    try:
      sys.stderr.write(_user_traceback(e))
    except BaseException:
      pass
    return MEMORY_EXIT_CODE
  except BaseException as e:  # KeyboardInterrupt, RecursionError, ... all go to the user
    try:
      sys.stderr.write(_user_traceback(e))
    except MemoryError:
      return MEMORY_EXIT_CODE
    return 1


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


def _drop_to_user(cfg, uid, scratch, cpu_s):
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
  _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
  os.chdir(scratch)
  os.environ.clear()
  os.environ.update(cfg["user_env"])
  os.environ["HOME"] = scratch
  os.environ["TMPDIR"] = scratch
  os.environ["PWD"] = scratch


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
        return min(os.WEXITSTATUS(status), 127) if os.WEXITSTATUS(status) != MEMORY_EXIT_CODE \
            else MEMORY_EXIT_CODE
      return 128 + os.WTERMSIG(status)


def _child_main(cfg, job, fds):
  """Leader: never returns."""
  code = 1
  try:
    os.setsid()
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):
      signal.signal(sig, signal.SIG_DFL)
    os.dup2(fds["in"], 0)
    os.dup2(fds["out"], 1)
    os.dup2(fds["err"], 2)
    keep = [0, 1, 2]
    if job["kind"] == "session":
      os.dup2(fds["req"], 3)
      os.dup2(fds["rep"], 4)
      keep += [3, 4]
    _close_fds_except(keep)
    if job.get("leader"):
      user_pid = os.fork()
      if user_pid:
        os._exit(_wait_as_init(user_pid))
    _user_main(cfg, job)
  except BaseException:
    try:
      os.write(2, traceback.format_exc().encode())
    except BaseException:
      pass
  os._exit(code)


def _user_main(cfg, job):
  _drop_to_user(cfg, job["uid"], job["scratch"], job["cpu_s"])
  _new_std_streams()
  kind = job["kind"]
  if kind == "exec":
    rc = exec_user_code(job["code"], _fresh_namespace())
    _flush_std()
    os._exit(rc)
  if kind == "func":
    _run_function(job)
  if kind == "session":
    _session_loop()
  os._exit(2)


def _run_function(job):
  """Unpickles (fn, args, kwargs), runs it, writes a pickled (ok, value) record to fd 1."""
  for p in job.get("sys_path", ()):
    if p not in sys.path:
      sys.path.append(p)
  out = os.fdopen(os.dup(1), "wb")
  sys.stdout = sys.stderr  # prints of the function must not corrupt the result record
  try:
    fn, args, kwargs = pickle.loads(job["payload"])
    record = (True, fn(*args, **kwargs))
  except MemoryError:
    _flush_std()
    os._exit(MEMORY_EXIT_CODE)
  except BaseException as e:
    record = (False, "".join(traceback.format_exception(type(e), e, e.__traceback__)))
  try:
    data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
  except BaseException as e:
    data = pickle.dumps((False, f"result is not picklable: {e!r}"))
  out.write(data)
  out.flush()
  _flush_std()
  os._exit(0)


def _session_loop():
  """Persistent interpreter: one namespace, one code request per frame on fd 3, reply on fd 4."""
  namespace = _fresh_namespace()
  while True:
    try:
      req = read_frame(3)
    except BaseException:
      os._exit(0)
    _new_std_streams()  # the host rewound and truncated the memfds, start from clean buffers
    rc = exec_user_code(req["code"], namespace)
    _flush_std()
    try:
      write_frame(4, rc)
    except BaseException:
      os._exit(3)


# ---------------------------------------------------------------------------------------------
# template
class Template:

  def __init__(self, cfg, ctl_in, ctl_out):
    self.cfg = cfg
    self.ctl_in = ctl_in
    self.ctl_out = ctl_out
    self.lim = cfg["limits"]
    self.free_uids = list(range(cfg["uid_lo"], cfg["uid_hi"]))
    self.calls = {}      # pidfd -> call record (exec/func)
    self.sessions = {}   # session_id -> session record
    self.sel = selectors.DefaultSelector()
    self.buf = b""
    self.pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY) if cfg["pidns"] else None
    # PID 1 of each call's namespace: a tiny exec'd process (cheaper than forking this big
    # interpreter twice). Orphans re-parent to it; killing it tears the namespace down.
    self.init_path = next((p for p in ("/usr/bin/sleep", "/bin/sleep") if os.path.exists(p)), None)
    self.reaping = {}    # init pidfd -> (init pid, uid, scratch) awaiting namespace teardown
    self.scratch_root = cfg["scratch_root"]
    os.makedirs(self.scratch_root, mode=0o711, exist_ok=True)
    os.chmod(self.scratch_root, 0o711)
    self.serial = 0

  # -- resources
  def _alloc_uid(self):
    if not self.free_uids:
      raise RuntimeError("no free sandbox uid (too many concurrent calls and sessions)")
    return self.free_uids.pop()

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
    self.serial += 1
    path = os.path.join(self.scratch_root, f"s{uid}_{self.serial}")
    os.mkdir(path, 0o700)
    if self.cfg["drop_uid"]:
      os.chown(path, uid, uid)
    return path

  def _release(self, uid, scratch, pgid=None):
    if pgid is not None and not self.cfg["pidns"]:
      try:
        os.killpg(pgid, signal.SIGKILL)  # background children left in the call's group
      except OSError:
        pass
    self._kill_uid(uid)
    shutil.rmtree(scratch, ignore_errors=True)
    self.free_uids.append(uid)

  # -- fork
  def _fork(self, job, fds):
    """Starts the call's process; returns (pid, init) with init = (pid, pidfd) or None."""
    init = None
    if self.cfg["pidns"]:
      # A second unshare(CLONE_NEWPID) fails with EINVAL unless we first return to our own ns.
      if _libc.setns(self.pidns_fd, CLONE_NEWPID) != 0 or _libc.unshare(CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "setns/unshare(CLONE_NEWPID) failed")
      if self.init_path:
        # The first child becomes PID 1 of the new namespace; our next fork joins it.
        ipid = os.posix_spawn(self.init_path, [self.init_path, "infinity"], {}, setsid=True)
        init = (ipid, os.pidfd_open(ipid))
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
    return pid, init

  def _stop_init(self, init, uid, scratch):
    """Kills the call's PID 1 (so its whole namespace) and releases uid/scratch once reaped."""
    ipid, ipidfd = init
    try:
      signal.pidfd_send_signal(ipidfd, signal.SIGKILL)
    except ProcessLookupError:
      pass
    self.reaping[ipidfd] = (ipid, uid, scratch)
    self.sel.register(ipidfd, selectors.EVENT_READ, ("init", ipidfd))

  def on_init_dead(self, ipidfd):
    entry = self.reaping.get(ipidfd)
    if entry is None:
      return
    ipid, uid, scratch = entry
    if os.waitpid(ipid, os.WNOHANG)[0] == 0:
      return
    del self.reaping[ipidfd]
    self.sel.unregister(ipidfd)
    os.close(ipidfd)
    if uid is not None:
      self._release(uid, scratch)

  def _end(self, rec):
    """After the call's process exited: tear down what it started, then free its uid."""
    if rec.get("init"):
      self._stop_init(rec["init"], rec["uid"], rec["scratch"])
    else:
      self._release(rec["uid"], rec["scratch"], rec["pid"])

  def _memfds(self, stdin):
    out = os.memfd_create("stdout", os.MFD_CLOEXEC)
    err = os.memfd_create("stderr", os.MFD_CLOEXEC)
    inp = os.memfd_create("stdin", os.MFD_CLOEXEC)
    if stdin:
      os.write(inp, stdin)
      os.lseek(inp, 0, os.SEEK_SET)
    return out, err, inp

  def start_call(self, req):
    kind = req["kind"]
    if kind == "session":
      return self.session_call(req)
    t0 = time.monotonic()
    uid = self._alloc_uid()
    scratch = self._make_scratch(uid)
    out, err, inp = self._memfds(req.get("stdin", b""))
    timeout = float(req["timeout_s"])
    job = {"kind": kind, "uid": uid, "scratch": scratch, "cpu_s": int(timeout) + 1,
           "code": req.get("code", ""), "payload": req.get("payload"),
           "sys_path": req.get("sys_path", ())}
    try:
      pid, init = self._fork(job, {"in": inp, "out": out, "err": err})
    except BaseException:
      for fd in (out, err, inp):
        os.close(fd)
      self._release(uid, scratch)
      raise
    os.close(inp)
    pidfd = os.pidfd_open(pid)
    call = {"rid": req["rid"], "kind": kind, "pid": pid, "pidfd": pidfd, "uid": uid,
            "scratch": scratch, "out": out, "err": err, "t0": t0, "init": init,
            "deadline": t0 + timeout, "killed": None}
    self.calls[pidfd] = call
    self.sel.register(pidfd, selectors.EVENT_READ, ("call", pidfd))

  def _read_memfd(self, fd):
    size = os.fstat(fd).st_size
    cap = self.lim["max_output_bytes"]
    data = os.pread(fd, min(size, cap), 0)
    return data, size > cap

  def _classify(self, rc, killed, over):
    if killed == "timeout":
      return "timeout"
    if over:
      return "output_limit"
    if rc == MEMORY_EXIT_CODE:
      return "memory_limit"
    if rc in (128 + signal.SIGXCPU, 128 + signal.SIGKILL) and killed is None:
      # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one.
      return "timeout" if rc == 128 + signal.SIGXCPU else "error"
    if rc == 128 + signal.SIGXFSZ:
      return "output_limit"
    return "ok" if rc == 0 else "error"

  def finish_call(self, pidfd):
    call = self.calls.get(pidfd)
    if call is None:
      return
    # A stale event of this select batch may name a reused fd number: only reap real exits.
    pid, status = os.waitpid(call["pid"], os.WNOHANG)
    if pid == 0:
      return
    del self.calls[pidfd]
    self.sel.unregister(pidfd)
    os.close(pidfd)
    if os.WIFEXITED(status):
      rc = os.WEXITSTATUS(status)
    else:
      rc = 128 + os.WTERMSIG(status)
    out, over_o = self._read_memfd(call["out"])
    err, over_e = self._read_memfd(call["err"])
    os.close(call["out"])
    os.close(call["err"])
    self._end(call)
    status_s = self._classify(rc, call["killed"], over_o or over_e)
    if rc > 128 and status_s == "error" and rc - 128 < 65:
      err += f"\nProcess killed by signal {signal.Signals(rc - 128).name}\n".encode()
    elif rc and status_s == "error" and rc < 128 and not err.strip():
      err += f"Process exited with code {rc}\n".encode()
    self.reply(call["rid"], {"status": status_s, "stdout": out, "stderr": err, "exit_code": rc,
                             "duration_s": time.monotonic() - call["t0"]})

  # -- sessions
  def _start_session(self, sid):
    uid = self._alloc_uid()
    scratch = self._make_scratch(uid)
    out, err, inp = self._memfds(b"")
    req_r, req_w = os.pipe2(os.O_CLOEXEC)
    rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
    job = {"kind": "session", "uid": uid, "scratch": scratch,
           "cpu_s": int(self.cfg["session_cpu_s"])}
    try:
      pid, init = self._fork(job, {"in": inp, "out": out, "err": err, "req": req_r, "rep": rep_w})
    finally:
      os.close(req_r)
      os.close(rep_w)
    pidfd = os.pidfd_open(pid)
    os.set_blocking(rep_r, False)
    s = {"sid": sid, "pid": pid, "pidfd": pidfd, "uid": uid, "init": init, "scratch": scratch, "out": out,
         "err": err, "inp": inp, "req_w": req_w, "rep_r": rep_r, "call": None, "rbuf": b""}
    self.sessions[sid] = s
    self.sel.register(pidfd, selectors.EVENT_READ, ("sess_dead", sid))
    self.sel.register(rep_r, selectors.EVENT_READ, ("sess_rep", sid))
    return s

  def session_call(self, req):
    sid = req["session_id"]
    t0 = time.monotonic()
    s = self.sessions.get(sid)
    if s is not None and s["call"] is not None:
      self.reply(req["rid"], {"status": "internal_error", "stdout": b"", "exit_code": None,
                              "stderr": b"session is busy with another call\n", "duration_s": 0.0})
      return
    if s is None:
      s = self._start_session(sid)
    for fd in (s["out"], s["err"], s["inp"]):
      os.ftruncate(fd, 0)
      os.lseek(fd, 0, os.SEEK_SET)  # shared file description: rewinds the child's offset too
    stdin = req.get("stdin", b"")
    if stdin:
      os.pwrite(s["inp"], stdin, 0)
    s["call"] = {"rid": req["rid"], "t0": t0, "deadline": t0 + float(req["timeout_s"]),
                 "killed": None, "note": req.get("note", b"")}
    try:
      write_frame(s["req_w"], {"code": req["code"]})
    except OSError:
      self.kill_session(s, "dead")

  def _session_result(self, s, rc, dead):
    call = s["call"]
    s["call"] = None
    out, over_o = self._read_memfd(s["out"])
    err, over_e = self._read_memfd(s["err"])
    status = self._classify(rc, call["killed"], over_o or over_e)
    if dead:
      err += b"\n[session terminated: its state is lost; the next call starts a fresh session]\n"
      if status == "ok":
        status = "error"
    self.reply(call["rid"], {"status": status, "stdout": out, "stderr": call["note"] + err,
                             "exit_code": rc, "duration_s": time.monotonic() - call["t0"]})

  def on_session_reply(self, sid):
    s = self.sessions.get(sid)
    if s is None:
      return
    try:
      chunk = os.read(s["rep_r"], 65536)
    except BlockingIOError:
      return
    if not chunk:
      self.sel.unregister(s["rep_r"])  # EOF: the pidfd event will finish the session
      os.close(s["rep_r"])
      s["rep_r"] = None
      return
    s["rbuf"] += chunk
    while len(s["rbuf"]) >= 4:
      (n,) = struct.unpack("<I", s["rbuf"][:4])
      if len(s["rbuf"]) < 4 + n:
        break
      frame, s["rbuf"] = s["rbuf"][4:4 + n], s["rbuf"][4 + n:]
      try:
        rc = pickle.loads(frame)
        rc = int(rc)
      except BaseException:  # user code wrote junk to fd 4: treat the session as broken
        self.kill_session(s, "error")
        return
      if s["call"] is not None:
        self._session_result(s, rc, dead=False)

  def kill_session(self, s, reason):
    if s["call"] is not None and s["call"]["killed"] is None:
      s["call"]["killed"] = reason
    for fd in (s["pidfd"], s["init"][1] if s["init"] else None):
      if fd is not None:
        try:
          signal.pidfd_send_signal(fd, signal.SIGKILL)
        except ProcessLookupError:
          pass

  def on_session_dead(self, sid, block=False):
    s = self.sessions.get(sid)
    if s is None:
      return
    pid, status = os.waitpid(s["pid"], 0 if block else os.WNOHANG)
    if pid == 0:  # stale event (the session was closed and restarted in this select batch)
      return
    del self.sessions[sid]
    self.sel.unregister(s["pidfd"])
    rc = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    if s["rep_r"] is not None:
      self.sel.unregister(s["rep_r"])
      os.close(s["rep_r"])
    if s["call"] is not None:
      self._session_result(s, rc, dead=True)
    for fd in (s["pidfd"], s["out"], s["err"], s["inp"], s["req_w"]):
      os.close(fd)
    self._end(s)

  def close_session(self, req):
    s = self.sessions.get(req["session_id"])
    if s is not None:
      self.kill_session(s, "closed")
      self.on_session_dead(s["sid"], block=True)  # reap now: a next call with this id must start fresh
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
      (n,) = struct.unpack("<I", self.buf[:4])
      if len(self.buf) < 4 + n:
        break
      req, self.buf = pickle.loads(self.buf[4:4 + n]), self.buf[4 + n:]
      kind = req["kind"]
      if kind == "close_session":
        self.close_session(req)
      elif kind == "ping":
        self.reply(req["rid"], {"pong": True, "free_uids": len(self.free_uids)})
      elif kind == "shutdown":
        raise EOFError
      else:
        try:
          self.start_call(req)
        except BaseException as e:
          self.reply(req["rid"], {"status": "internal_error", "stdout": b"", "exit_code": None,
                                  "stderr": f"sandbox failed to start the call: {e!r}\n".encode(),
                                  "duration_s": 0.0})

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
          if not self.cfg["pidns"]:
            self._kill_group_and_uid(s["pid"], s["uid"])
        else:
          nxt = c["deadline"] if nxt is None else min(nxt, c["deadline"])
    return None if nxt is None else max(0.0, nxt - now)

  def run(self):
    os.set_blocking(self.ctl_in, False)
    self.sel.register(self.ctl_in, selectors.EVENT_READ, ("ctl", None))
    try:
      while True:
        timeout = self.check_deadlines()
        for key, _ in self.sel.select(timeout):
          what, arg = key.data
          if what == "ctl":
            self.on_control()
          elif what == "call":
            self.finish_call(arg)
          elif what == "sess_rep":
            self.on_session_reply(arg)
          elif what == "sess_dead":
            self.on_session_dead(arg)
          elif what == "init":
            self.on_init_dead(arg)
    except EOFError:
      pass
    finally:
      self.shutdown()

  def shutdown(self):
    # Kill everything first, then reap the call processes before their namespaces' PID 1s:
    # a namespace's teardown waits until its zombies are reaped, and ours are our children.
    recs = list(self.calls.values()) + list(self.sessions.values())
    inits = [r["init"] for r in recs if r.get("init")] + \
        [(v[0], fd) for fd, v in self.reaping.items()]
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
    shutil.rmtree(self.scratch_root, ignore_errors=True)


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
  vm = 0
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmSize:"):
        vm = int(line.split()[1]) * 1024
  cfg["as_limit"] = vm + cfg["limits"]["memory_limit_mb"] * (1 << 20)
  if cfg["drop_uid"] and not cfg["pidns"]:
    _kill_uid_range(cfg["uid_lo"], cfg["uid_hi"])  # leftovers of a dead predecessor
  gc.collect()
  gc.freeze()  # keep the preloaded heap out of the children's GC passes: fewer CoW faults
  tpl = Template(cfg, ctl_in, ctl_out)
  write_frame(ctl_out, {"ready": True, "pid": os.getpid(), "preloaded": loaded,
                        "startup_s": time.monotonic() - t0, "as_limit": cfg["as_limit"],
                        "pidns_self": os.getpid() == 2 or os.getpid() == 1})
  tpl.run()


if __name__ == "__main__":
  main()
