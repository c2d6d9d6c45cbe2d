"""Threat class 1: the sandbox protocol. Nothing a call writes is ever unpickled or executed by
the template or the host; the protocol pipes are out of reach; completion comes from the
process (exit, or a session's stop), never from a frame the code could forge."""

import builtins
import os
import pickle
import re
import struct
import time

import pytest
from pool_helpers import pool_uid_range, sandbox_pids, use_level_runner

from rstar_jax.tools import code_pool, sandbox_template, wire

TOOLS_DIR = os.path.dirname(os.path.abspath(code_pool.__file__))

runner = use_level_runner()


class _Boom:
  def __reduce__(self):
    return (exec, ("import builtins; builtins.PWNED_BY_PICKLE = True",))


def test_no_pickle_is_ever_loaded_from_sandbox_bytes():
  # The only pickle left is host -> sandbox (run_function's payload, loaded in the call's child).
  for name in ("code_pool.py", "sandbox_template.py", "server.py", "client.py", "wire.py"):
    src = open(os.path.join(TOOLS_DIR, name)).read()
    loads = [m.start() for m in re.finditer(r"pickle\.loads?\(", src)]
    if name == "sandbox_template.py":
      assert len(loads) == 1 and "pickle.loads(payload)" in src, name
    else:
      assert loads == [], (name, loads)


@pytest.mark.parametrize(
  "blob",
  [
    pickle.dumps(_Boom()),
    struct.pack("<I", 10) + b"x" * 3,  # length beyond the data
    b"s" + struct.pack("<I", 1 << 31),  # string claiming 2 GiB
    b"l" + struct.pack("<I", 1 << 30) + b"N",  # list claiming 2^30 items
    b"d" + struct.pack("<I", 1) + b"l" + struct.pack("<I", 0) + b"N",  # unhashable key
    b"s" + struct.pack("<I", 2) + b"\xff\xfe",  # invalid UTF-8
    b"I" + struct.pack("<I", 3) + b"1e9",  # malformed big int
    b"l" + struct.pack("<I", 1) * 40 + b"N",  # nested deeper than allowed
    b"NN",  # trailing bytes
    b"",
  ],
)
def test_wire_rejects_malformed_and_pickled_bytes(blob):
  with pytest.raises(wire.WireError):
    wire.decode(blob)
  assert not hasattr(builtins, "PWNED_BY_PICKLE")


def test_wire_round_trips_plain_values():
  v = {
    "a": [1, -2, 2**70, -(2**70), 1.5, float("inf")],
    "b": (b"\x00\xff", None, True),
    3: "z\ud800",
    None: {"n": False, b"k": 2**59},
  }
  assert wire.decode(wire.encode(v)) == v
  with pytest.raises(wire.WireError, match="dict key"):  # hashes a sender could make collide
    wire.encode({(1, "k"): 1})
  with pytest.raises(wire.WireError, match="cannot encode"):
    wire.encode({"f": object()})
  with pytest.raises(wire.WireError, match="exceeds"):
    wire.frame_length(struct.pack("<I", 1000), 999)


def test_host_rejects_forged_template_replies():
  limit = 1 << 16
  good = {"rid": 1, "status": "ok", "stdout": b"", "stderr": b"", "duration_s": 0.1, "exit_code": 0}
  assert code_pool._check_reply(dict(good), limit)["status"] == "ok"
  for bad in (
    {**good, "status": "pwned"},
    {**good, "stdout": b"x" * (limit + 1)},
    {**good, "exit_code": 10**9},
    {**good, "duration_s": float("nan")},
    {**good, "rid": "1"},
    [1, 2],
  ):
    with pytest.raises(wire.WireError):
      code_pool._check_reply(bad, limit)


def test_template_rejects_bad_requests():
  for bad in (
    {"kind": "exec", "rid": 1, "code": "1", "stdin": b"", "timeout_s": float("nan")},
    {"kind": "exec", "rid": 1, "code": "1", "stdin": b"", "timeout_s": 1e12},
    {"kind": "exec", "rid": True, "code": "1", "stdin": b"", "timeout_s": 1.0},
    {"kind": "eval", "rid": 1},
  ):
    with pytest.raises(sandbox_template.wire.WireError):  # the template's own copy of `wire`
      sandbox_template.check_request(bad)


def test_call_holds_no_protocol_fd(runner, lpool):
  code = (
    "import os\nfor fd in sorted(int(f) for f in os.listdir('/proc/self/fd')):\n"
    "    try:\n        print(fd, os.readlink(f'/proc/self/fd/{fd}'))\n"
    "    except OSError:\n        pass"
  )
  r = runner.run(lpool.execute(code))
  assert r.status == "ok", r
  fds = dict(line.split(" ", 1) for line in r.stdout.splitlines())
  # 0/1/2 are the call's memfds; the only other fd is the one listdir itself opened.
  assert {"0", "1", "2"} <= set(fds) and len(fds) <= 4, fds
  assert not any("pipe:" in t or "socket:" in t for t in fds.values()), fds


def test_session_holds_only_its_memfds(runner, lpool):
  code = (
    "import os\nfor fd in sorted(int(f) for f in os.listdir('/proc/self/fd')):\n"
    "    try:\n        print(fd, os.readlink(f'/proc/self/fd/{fd}'))\n"
    "    except OSError:\n        pass"
  )
  r = runner.run(lpool.execute(code, session_id="fds"))
  runner.run(lpool.close_session("fds"))
  assert r.status == "ok", r
  fds = dict(line.split(" ", 1) for line in r.stdout.splitlines())
  assert not any("pipe:" in t or "socket:" in t for t in fds.values()), fds
  assert all(t.startswith("/memfd:") for fd, t in fds.items() if int(fd) <= 4), fds


_FORGE = """
import os, pickle, struct
class P:
    def __reduce__(self):
        return (exec, ("import builtins; builtins.PLANTED = 1",))
blob = pickle.dumps(P())
frame = struct.pack('<I', len(blob)) + blob
hits = 0
for fd in range(0, 64):
    try:
        os.write(fd, frame)
        hits += 1
    except OSError:
        pass
print('wrote', hits)
"""


def test_forged_pickle_frames_reach_nobody(runner, lpool):
  for sid in (None, "forge"):
    r = runner.run(lpool.execute(_FORGE, session_id=sid))
    assert r.status in ("ok", "error"), r
  r = runner.run(
    lpool.execute("import builtins\nprint(hasattr(builtins, 'PLANTED'))", session_id="forge")
  )
  assert r.stdout.endswith("False\n"), r
  r = runner.run(lpool.execute("import builtins\nprint(hasattr(builtins, 'PLANTED'))"))
  assert r.stdout == "False\n", r
  assert not hasattr(builtins, "PLANTED")
  assert lpool._templates[0].restarts == 0
  runner.run(lpool.close_session("forge"))


def test_exec_completion_is_the_exit_not_closed_fds(runner, lpool):
  code = "import os, time\nfor fd in (0, 1, 2):\n    os.close(fd)\ntime.sleep(30)"
  t0 = time.monotonic()
  r = runner.run(lpool.execute(code, timeout_s=1.0))
  assert r.status == "timeout", r
  assert time.monotonic() - t0 >= 0.9


def test_session_cannot_forge_completion(runner, lpool):
  # Stopping itself is the only "signal" a session has. A stop with no exit code written is
  # the user code's own (issue 27): the session ends there, so the code's remaining work can
  # neither run as the next call nor forge that call's result.
  sid = "forge-stop"
  runner.run(lpool.execute("x = 41", session_id=sid))
  code = "import os, signal, time\nos.kill(os.getpid(), signal.SIGSTOP)\ntime.sleep(30)"
  r = runner.run(lpool.execute(code, session_id=sid, timeout_s=5.0))
  assert r.status != "ok" and "stopped its own process" in r.stderr, r
  r = runner.run(lpool.execute("print(x + 1)", session_id=sid, timeout_s=1.0))
  assert r.status == "error" and "NameError" in r.stderr, r  # a fresh session, not sleep(30)
  r = runner.run(lpool.execute("print('fresh')", session_id=sid))
  assert r.stdout == "fresh\n"
  runner.run(lpool.close_session(sid))
  deadline = time.monotonic() + 3
  while sandbox_pids(*pool_uid_range(lpool)) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert sandbox_pids(*pool_uid_range(lpool)) == []


def test_session_memfd_tampering_stays_in_the_session(runner, lpool):
  # (Its rare template restart at rlimits was the orphan sweep reaping a closed session first:
  # test_threats_round3.test_the_orphan_sweep_leaves_closed_sessions_to_their_own_reap.)
  sid = "tamper"
  code = (
    "import os\nos.ftruncate(3, 1000)\nos.pwrite(3, b'\\xff' * 100, 0)\n"
    "os.pwrite(4, b'99999999999999999999' * 10, 0)\nos.dup2(1, 4)\nos.dup2(2, 3)"
  )
  r = runner.run(lpool.execute(code, session_id=sid))
  assert r.status in ("ok", "error"), r
  # The session broke its own plumbing: its next call may misbehave, but it answers promptly
  # and nothing outside the session notices.
  t0 = time.monotonic()
  r = runner.run(lpool.execute("print('still fine')", session_id=sid, timeout_s=2.0))
  assert r.status in ("ok", "error", "timeout") and time.monotonic() - t0 < 10, r
  r = runner.run(lpool.execute("print(6 * 7)"))
  assert (r.status, r.stdout) == ("ok", "42\n")
  assert lpool._templates[0].restarts == 0
  runner.run(lpool.close_session(sid))


def test_run_function_result_is_plain_values(runner, lpool):
  with pytest.raises(code_pool.FunctionRunError, match="not a plain value"):
    runner.run(lpool.run_function(type, 1, timeout_s=2.0))  # returns a class
  assert runner.run(lpool.run_function(divmod, 7, 2, timeout_s=2.0)) == (3, 1)
