"""Second red team (issue 27), the sandbox classes, at every isolation level this machine offers:
forged statuses (3), memory outside the limit (4), /proc channels (5), accounting (6), host
faults (7) and the smaller ones (9): oom_score_adj, /dev/ptmx, capability sets, uid ranges.
Network probes: none (no socket is opened here)."""

import asyncio
import logging
import os
import secrets
import struct
import time

import pytest
from pool_helpers import bound_back_names, level_available, level_pool, use_level_runner

from rstar_jax.tools import wire
from rstar_jax.tools.code_pool import ISOLATION_LEVELS

runner = use_level_runner()


def _root_only(pool, what):
  if pool.isolation_level == "rlimits":
    pytest.skip(f"{what}: the rlimits level runs calls as the host's uid, without root")


# --- class 1: the template never holds a call's data --------------------------------------
# Counts, in the calling process's own readable anonymous memory (all of it inherited from the
# template at fork, or its own), the places holding each needle. The needles are built byte by
# byte in a ctypes buffer and found with libc memmem, so the scan itself makes no copy of them.
_SCAN = """
import ctypes, json
libc = ctypes.CDLL(None)
libc.memmem.restype = ctypes.c_void_p
libc.memmem.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
regions = []
for line in open('/proc/self/maps'):
    f = line.split()
    name = f[5] if len(f) > 5 else ''
    if f[1][0] == 'r' and f[4] == '0' and name not in ('[vvar]', '[vsyscall]', '[vvar_vclock]'):
        lo, hi = (int(x, 16) for x in f[0].split('-'))
        regions.append((lo, hi))
hits = {}
for label, hidden in HIDDEN.items():
    needle = ctypes.create_string_buffer(len(hidden))
    for i, b in enumerate(hidden):
        needle[i] = b ^ 0x5A
    own, n = ctypes.addressof(needle), len(hidden)
    count = 0
    for lo, hi in regions:
        at = lo
        while at < hi:
            p = libc.memmem(at, hi - at, own, n)
            if not p:
                break
            count += p != own
            at = p + 1
    hits[label] = count
print(json.dumps(hits))
"""


def _hide(text):
  return bytes(b ^ 0x5A for b in text.encode())


def test_later_calls_never_see_earlier_calls_data(runner, lpool):
  import json
  import operator

  marks = {k: f"{k}-{secrets.token_hex(12)}" for k in ("code", "stdin", "stdout", "arg", "sess")}
  # Several sizes: small frames are overwritten by the next ones, big ones are unmapped when
  # freed; the sizes in between stay in the template's heap if it ever held them.
  for pad in (100, 3000, 8000, 30000):
    r = runner.run(
      lpool.execute(
        f"secret = {marks['code']!r}\nimport sys\nsys.stdin.read()\n"
        f"print({marks['stdout'][::-1]!r}[::-1] + '.' * {pad})\n#" + "." * pad,
        stdin=marks["stdin"] + "." * pad,
      )
    )
    assert r.status == "ok" and r.stdout.startswith(marks["stdout"]), r
    arg = marks["arg"] + "." * pad
    assert runner.run(lpool.run_function(operator.add, arg, "")) == arg
    r = runner.run(
      lpool.execute(f"s = {marks['sess']!r} + '.' * {pad}\nprint(s)", session_id="leak")
    )
    assert r.status == "ok", r
  # A control needle no call ever used proves the scan finds nothing of its own making.
  marks["control"] = f"control-{secrets.token_hex(12)}"
  hidden = {k: _hide(v) for k, v in marks.items()}
  r = runner.run(lpool.execute(f"HIDDEN = {hidden!r}\n" + _SCAN, timeout_s=30.0))
  runner.run(lpool.close_session("leak"))
  assert r.status == "ok", r
  assert json.loads(r.stdout) == {k: 0 for k in marks}, r.stdout


# --- class 2: each call's scratch is its own tmpfs -----------------------------------------
def test_scratch_is_private_bounded_and_gone_with_the_call(runner, lpool):
  _root_only(lpool, "a per-call tmpfs needs root")
  fill = (
    "import os\nhere = os.getcwd()\nn = 0\ntry:\n"
    "    for i in range(100000):\n"
    "        with open(f'f{i}', 'wb') as f:\n            f.write(b'x' * 60000)\n        n += 1\n"
    "except OSError as e:\n    print('full', e.errno)\n"
    "os.chmod(here, 0o777)\nfor d in ('/tmp', '/dev/shm', '/var/tmp'):\n"
    "    if os.path.isdir(d):\n        open(os.path.join(d, 'mine'), 'w').write('x')\n"
    "print(n * 60000 <= SIZE, sorted(os.listdir('/tmp'))[:2])"
  )
  size = lpool.config.scratch_bytes
  r = runner.run(lpool.execute(f"SIZE = {size}\n" + fill, timeout_s=20.0))
  assert r.status == "ok" and "full 28" in r.stdout and "True" in r.stdout, r  # ENOSPC
  peek = (
    "import os\nseen = []\nfor d in ('.', '/tmp', '/dev/shm', '/var/tmp'):\n"
    "    if os.path.isdir(d):\n        seen += os.listdir(d)\n"
    f"print(sorted(n for n in seen if n not in {sorted(bound_back_names(lpool.config))!r}))"
  )
  r = runner.run(lpool.execute(peek))
  assert (r.status, r.stdout) == ("ok", "[]\n"), r  # the next call starts empty
  assert lpool._templates[0].restarts == 0


@pytest.mark.parametrize("level", ["namespaces", "pidns", "uid"])
def test_a_checkout_under_tmp_stays_importable_and_read_only(runner, level):
  """The scratch covers /tmp; what calls import from (a checkout, a venv) may live there (CI
  clones into /tmp): it is bound back read-only, so run_function and imports still work."""
  import tempfile

  home = tempfile.mkdtemp(prefix="rstar_checkout_", dir="/tmp")
  os.chmod(home, 0o755)
  with open(os.path.join(home, "tmp_checkout_mod.py"), "w") as f:
    f.write("def triple(x):\n  return 3 * x\n")
  pool = level_pool(runner, level, extra_ro_binds=(home,))
  try:
    code = (
      f"import sys\nsys.path.insert(0, {home!r})\nimport tmp_checkout_mod\n"
      "print(tmp_checkout_mod.triple(14))\ntry:\n"
      f"    open({os.path.join(home, 'tmp_checkout_mod.py')!r}, 'a').write('x')\n"
      "    print('wrote')\nexcept OSError as e:\n    print('blocked')"
    )
    r = runner.run(pool.execute(code))
    assert (r.status, r.stdout) == ("ok", "42\nblocked\n"), r
  finally:
    runner.run(pool.close())
    import shutil

    shutil.rmtree(home, ignore_errors=True)


def test_scratch_counts_toward_the_memory_limit():
  from rstar_jax.tools.code_pool import PoolConfig

  assert PoolConfig(memory_limit_mb=256).scratch_bytes == 32 << 20
  with pytest.raises(ValueError, match="scratch_mb"):
    PoolConfig(memory_limit_mb=256, scratch_mb=200)


# --- class 3: statuses come from what the supervisor observed -------------------------------
@pytest.mark.parametrize(
  "code",
  [
    "import sys\nsys.exit(152)",  # was timeout (128 + SIGXCPU)
    "import sys\nsys.exit(247)",  # was memory_limit
    "import sys\nsys.exit(153)",  # was output_limit (128 + SIGXFSZ)
    "import os\nos._exit(137)",  # was "Process killed by signal SIGKILL"
  ],
)
def test_exit_codes_cannot_forge_a_status(runner, lpool, code):
  r = runner.run(lpool.execute(code))
  assert r.status == "error", r
  assert "killed by signal" not in r.stderr, r


def test_self_stop_never_completes_a_session_call(runner, lpool):
  # A stop is how a session's trusted loop says "done"; user code stopping itself mid-call
  # must not be taken for it, nor may its remaining code run as (and forge) the next call.
  stop = "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGSTOP)\n"
  runner.run(lpool.execute("x = 1", session_id="stopper"))
  r = runner.run(lpool.execute(stop + "print('after')", session_id="stopper"))
  assert r.status == "error" and "stopped its own process" in r.stderr, r
  r = runner.run(lpool.execute("print('mine')", session_id="stopper"))
  assert (r.status, r.stdout) == ("ok", "mine\n"), r
  runner.run(lpool.close_session("stopper"))
  r = runner.run(lpool.execute(stop + "print('after')", timeout_s=1.0))
  # Plain call: the stopped process is killed at its deadline (or, as its namespace's PID 1,
  # it cannot stop itself at all): never `ok` with its output cut short.
  assert r.status == "timeout" or (r.status, r.stdout) == ("ok", "before\nafter\n"), r


def test_observed_limits_keep_their_status(runner, lpool):
  grow = "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 2**20))"
  r = runner.run(lpool.execute(grow, timeout_s=8.0))
  assert r.status == "memory_limit" and "MemoryError" in r.stderr, r
  r = runner.run(lpool.execute("while True:\n    print('y' * 4096)"))
  assert r.status == "output_limit", r
  # A request past the limit is refused before any memory is used: the program's own error.
  r = runner.run(lpool.execute("bytearray(10**11)"))
  assert r.status == "error" and "MemoryError" in r.stderr, r


# --- class 4: no exec, no memfds of the call's own --------------------------------------------
def test_exec_and_memfd_create_are_refused(runner, lpool):
  code = (
    "import os, sys\nout = []\n"
    "try:\n    os.execv(sys.executable, [sys.executable, '-c', 'print(1)'])\n"
    "except OSError as e:\n    out.append(type(e).__name__)\n"
    "try:\n    os.memfd_create('x')\nexcept OSError as e:\n    out.append(type(e).__name__)\n"
    "print(out)"
  )
  r = runner.run(lpool.execute(code))
  assert (r.status, r.stdout) == ("ok", "['PermissionError', 'PermissionError']\n"), r


# --- class 5: /proc shows a call only its own processes --------------------------------------
def test_proc_hides_concurrent_calls(runner, lpool):
  _root_only(lpool, "hidepid needs distinct uids per call")
  mark = "mk" + secrets.token_hex(5)
  victim = (
    "import ctypes, time\n"
    f"ctypes.CDLL(None).prctl(15, b'{mark}', 0, 0, 0)\n"  # PR_SET_NAME
    "time.sleep(2.5)"
  )
  spy = (
    "import os, time\ntime.sleep(0.8)\nseen = []\n"
    "for p in os.listdir('/proc'):\n    if p.isdigit():\n"
    "        try:\n            seen.append(open(f'/proc/{p}/comm').read().strip())\n"
    "        except OSError:\n            pass\n"
    "print(len(seen), sorted(set(seen)))"
  )

  async def both():
    return await asyncio.gather(
      lpool.execute(victim, timeout_s=5.0), lpool.execute(spy, timeout_s=5.0)
    )

  _, r = runner.run(both())
  assert r.status == "ok", r
  assert mark not in r.stdout, r.stdout
  assert r.stdout.split()[0] == "1", r.stdout  # its own process only


# --- class 9: OOM order, no terminal, no capabilities ------------------------------------------
def test_oom_score_adj_is_high(runner, lpool):
  r = runner.run(lpool.execute("print(open('/proc/self/oom_score_adj').read().strip())"))
  assert r.stdout == "1000\n", r
  if lpool.isolation_level != "rlimits":  # there a call has the host's uid (root here)
    r = runner.run(lpool.execute("open('/proc/self/oom_score_adj', 'w').write('0')"))
    assert r.status == "error", r  # lowering it needs CAP_SYS_RESOURCE


def test_capability_sets_are_empty(runner, lpool):
  _root_only(lpool, "a non-root template cannot drop its bounding set")
  r = runner.run(
    lpool.execute("print(''.join(l for l in open('/proc/self/status') if l.startswith('Cap')))")
  )
  caps = dict(line.split(":") for line in r.stdout.split("\n") if line)
  assert {k: int(v, 16) for k, v in caps.items()} == {
    "CapInh": 0,
    "CapPrm": 0,
    "CapEff": 0,
    "CapBnd": 0,
    "CapAmb": 0,
  }, r.stdout


def test_ptmx_is_unreachable(runner, lpool):
  _root_only(lpool, "the rlimits level cannot change the host's /dev")
  r = runner.run(lpool.execute("import os\nprint(os.openpty())"))
  assert r.status == "error" and "Error" in r.stderr, r


def test_two_pools_never_share_a_uid(runner):
  if os.geteuid() != 0:
    pytest.skip("uid ranges are used only by root levels")
  a = level_pool(runner, "uid", num_workers=1, uids_per_template=8)
  b = level_pool(runner, "uid", num_workers=1, uids_per_template=8)
  try:
    ra = range(a._uid_base, a._uid_base + 8)
    rb = range(b._uid_base, b._uid_base + 8)
    assert not set(ra) & set(rb), (a._uid_base, b._uid_base)
    ua = int(runner.run(a.execute("import os\nprint(os.getuid())")).stdout)
    ub = int(runner.run(b.execute("import os\nprint(os.getuid())")).stdout)
    assert ua in ra and ub in rb
  finally:
    runner.run(a.close())
    runner.run(b.close())


# --- class 6: accounting -------------------------------------------------------------------
def test_queue_timeout_zero_runs_on_an_idle_pool(runner, lpool):
  r = runner.run(lpool.execute("print(7)", queue_timeout_s=0))
  assert (r.status, r.stdout) == ("ok", "7\n"), r


def test_cancelled_call_keeps_its_slot_until_it_ends(runner):
  pool = level_pool(runner, ISOLATION_LEVELS[-1], num_workers=1)  # any level: host logic

  async def scenario():
    slow = asyncio.ensure_future(pool.execute("import time\ntime.sleep(1.5)", timeout_s=3.0))
    await asyncio.sleep(0.5)
    slow.cancel()
    await asyncio.sleep(0.05)
    busy = await pool.execute("print(1)", queue_timeout_s=0.3)
    t0 = time.monotonic()
    later = await pool.execute("print(2)", queue_timeout_s=10.0)
    return busy, later, time.monotonic() - t0

  try:
    busy, later, waited = runner.run(scenario())
  finally:
    runner.run(pool.close())
  assert busy.status == "internal_error" and "queue_timeout" in busy.stderr, busy
  assert later.stdout == "2\n" and waited > 0.3, (later, waited)


def test_idle_sessions_cannot_take_every_uid(runner):
  if os.geteuid() != 0:
    pytest.skip("sandbox uids are used only by root levels")
  pool = level_pool(runner, "uid", num_workers=2, uids_per_template=8)

  async def scenario():
    for i in range(10):
      r = await pool.execute(f"v = {i}", session_id=f"s{i}")
      assert r.status == "ok", r
    return await pool.execute("print('plain')")

  try:
    r = runner.run(scenario())
  finally:
    runner.run(pool.close())
  assert (r.status, r.stdout) == ("ok", "plain\n"), r


def test_sessions_are_capped_lru_and_expire(runner):
  pool = level_pool(
    runner, ISOLATION_LEVELS[-1], num_workers=2, max_sessions=2, session_idle_ttl_s=1.0
  )

  async def scenario():
    for sid in ("a", "b"):
      await pool.execute("x = 1", session_id=sid)
    await pool.execute("x", session_id="a")  # "b" is now the least recently used
    await pool.execute("x = 3", session_id="c")
    a = await pool.execute("print(x)", session_id="a")
    b = await pool.execute("print(x)", session_id="b")
    await asyncio.sleep(2.0)
    expired = await pool.execute("print(x)", session_id="b")
    return a, b, expired

  try:
    a, b, expired = runner.run(scenario())
  finally:
    runner.run(pool.close())
  assert a.stdout == "1\n", a
  assert "NameError" in b.stderr and "[session evicted" in b.stderr, b
  assert "NameError" in expired.stderr and "expired after 1 s idle" in expired.stderr, expired


# --- class 7: host faults ------------------------------------------------------------------
def test_colliding_dict_keys_are_refused_fast():
  # Ints congruent mod 2**61 - 1 share a hash: 20,000 of them would make the decode quadratic.
  p = (1 << 61) - 1
  keys = [str(1 + i * p).encode() for i in range(20000)]
  body = b"d" + struct.pack("<I", len(keys))
  body += b"".join(b"I" + struct.pack("<I", len(k)) + k + b"N" for k in keys)
  with pytest.raises(wire.WireError, match="dict key"):
    wire.decode(body)
  # Refused at the first colliding key (the second: 1 itself is allowed), whatever follows: with
  # only filler after it, the error is still the key's. So at most two keys are ever hashed (a
  # count, not a clock: the machine may be loaded).
  first_two = b"".join(b"I" + struct.pack("<I", len(k)) + k + b"N" for k in keys[:2])
  filler = b"d" + struct.pack("<I", len(keys)) + first_two + b"\xff" * (2 * len(keys))
  with pytest.raises(wire.WireError, match="dict key"):
    wire.decode(filler)
  for key in ((1, 2), 1.5, 1 << 61):
    with pytest.raises(wire.WireError, match="dict key"):
      wire.encode({key: 1})


def test_host_stall_does_not_kill_a_template_that_answered(runner):
  pool = level_pool(runner, ISOLATION_LEVELS[-1], num_workers=1, reply_grace_s=0.2)

  async def scenario():
    task = asyncio.ensure_future(pool.execute("print('fine')", timeout_s=0.5))
    while not pool._templates[0].pending:  # until the request is on its way
      await asyncio.sleep(0)
    time.sleep(1.5)  # the host's loop stalls past the 0.7 s wait; the reply lands meanwhile
    return await task

  try:
    r = runner.run(scenario())
    restarts = pool._templates[0].restarts
  finally:
    runner.run(pool.close())
  assert (r.status, r.stdout) == ("ok", "fine\n"), r
  assert restarts == 0


# --- issue 29 row 14: the isolation level is a warning only when it is a fallback -------------
def test_isolation_level_log_level(runner, caplog):
  levels = [lv for lv in ISOLATION_LEVELS if not level_available(lv)]
  with caplog.at_level(logging.INFO, logger="rstar_jax.tools.code_pool"):
    for level in {levels[0], levels[-1]}:
      runner.run(level_pool(runner, level, num_workers=1, preload=()).close())
  recs = [r for r in caplog.records if "isolation level" in r.getMessage()]
  assert len(recs) == len({levels[0], levels[-1]}), recs
  for r in recs:
    best = f"level: {ISOLATION_LEVELS[0]} " in r.getMessage()
    assert r.levelno == (logging.INFO if best else logging.WARNING), r.getMessage()


# --- what every call inherits from the template (built once there, never per call) ----------
_DIRTY = """
import os, sys
os.environ['LEAKED'] = 'x'
os.environ.pop('HOME', None)
os.environ['PATH'] = '/leaked'
sys.stdout.write('buffered-but-never-flushed')
sys.stdin.read(2)
sys.stdout.reconfigure(encoding='latin-1')
sys.stderr.reconfigure(errors='strict')
sys.stdin = sys.stdout = sys.stderr = None
os._exit(0)
"""
_CHECK = """
import os, sys
env = dict(os.environ)
print(sorted(env) == sorted(EXPECTED), env['HOME'] == env['TMPDIR'] == env['PWD'] == os.getcwd(),
      env['PATH'], 'LEAKED' in env)
print(sys.stdout.encoding, sys.stderr.errors, sys.stdout.buffer.raw.fileno(), sys.stdin.read())
print('\\u00e9', file=sys.stderr)
"""


def test_each_call_starts_from_the_templates_untouched_env_and_streams(runner, lpool):
  """A call's environment and std streams are built once in the template (not per call): a
  call that rewrites them, leaves bytes in their buffers and exits changes nothing for the next
  call of the same template (exec calls, and a session's first call)."""
  from rstar_jax.tools.code_pool import _HIDDEN_DEVICES, _THREAD_ENV

  expected = ["PATH", "LANG", "PYTHONIOENCODING", "HOME", "TMPDIR", "PWD"]
  expected += list(_THREAD_ENV) + list(_HIDDEN_DEVICES)
  want = "True True /usr/bin:/bin False\nutf-8 backslashreplace 1 abcdef\n"
  for i in range(3):
    r = runner.run(lpool.execute(_DIRTY, stdin="abcdef"))
    assert r.status == "ok", r  # (reconfigure flushed its own bytes: its output, not leaked)
    r = runner.run(lpool.execute(f"EXPECTED = {expected!r}\n" + _CHECK, stdin="abcdef"))
    assert (r.status, r.stdout, r.stderr) == ("ok", want, "\u00e9\n"), r
  # Twice: the template listens for session stops only while it has a session.
  for sid in ("fresh", "fresh-again"):
    r = runner.run(
      lpool.execute(f"EXPECTED = {expected!r}\n" + _CHECK, stdin="abcdef", session_id=sid)
    )
    assert (r.status, r.stdout, r.stderr) == ("ok", want, "\u00e9\n"), r
    r = runner.run(lpool.execute("print(sys.stdin.read())", stdin="x", session_id=sid))
    assert (r.status, r.stdout) == ("ok", "x\n"), r
    assert runner.run(lpool.close_session(sid))
