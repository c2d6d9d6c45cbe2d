"""Stateful sessions (ASTER) and the function runner used by the answer verifier."""

import os
import time

import pytest
from pool_helpers import pool_uid_range, sandbox_pids

from rstar_jax.tools.code_pool import FunctionRunError
from rstar_jax.tools.render import truncate_middle


# Module-level so they pickle by reference into the sandbox.
def add(a, b, scale=1):
  return (a + b) * scale


def spin_forever():
  while True:
    pass


def raise_value_error(msg):
  raise ValueError(msg)


def whoami_and_env():
  return os.getuid(), dict(os.environ)


def sympy_equal(a, b):
  import sympy

  return bool(sympy.simplify(sympy.sympify(a) - sympy.sympify(b)) == 0)


def hog_memory():
  return len(bytearray(10**11))


def ex(runner, pool, code, sid, stdin="", timeout_s=4.0):
  return runner.run(pool.execute(code, stdin, timeout_s=timeout_s, session_id=sid))


def test_session_state_persists_and_isolates(runner, pool):
  assert ex(runner, pool, "x = 20\nimport math", "a").status == "ok"
  assert ex(runner, pool, "y = 5", "b").status == "ok"
  r = ex(runner, pool, "x + 1", "a")
  assert (r.status, r.stdout) == ("ok", "21\n")
  r = ex(runner, pool, "print(math.sqrt(x + 5))\ny", "a")
  assert r.status == "error" and "NameError" in r.stderr and r.stdout == "5.0\n"
  r = ex(runner, pool, "x", "b")
  assert r.status == "error" and "NameError: name 'x' is not defined" in r.stderr
  # Output and stdin are per call, not accumulated across calls.
  r = ex(runner, pool, "print(input() * 2)", "a", stdin="ab")
  assert r.stdout == "abab\n"
  r = ex(runner, pool, "print(input())", "a", stdin="z\n")
  assert r.stdout == "z\n"
  assert runner.run(pool.close_session("a")) is True
  assert runner.run(pool.close_session("b")) is True
  assert runner.run(pool.close_session("b")) is False
  r = ex(runner, pool, "x", "a")  # a closed session starts fresh
  assert r.status == "error" and "NameError" in r.stderr
  runner.run(pool.close_session("a"))


def test_session_error_keeps_state_and_sys_exit_does_not_end_it(runner, pool):
  ex(runner, pool, "k = 3", "s")
  assert ex(runner, pool, "1/0", "s").status == "error"
  assert ex(runner, pool, "import sys\nsys.exit(2)", "s").status == "error"
  assert ex(runner, pool, "k * 2", "s").stdout == "6\n"
  runner.run(pool.close_session("s"))


def test_session_timeout_reports_and_restarts(runner, pool):
  ex(runner, pool, "state = 'kept'", "t")
  r = ex(runner, pool, "while True: pass", "t", timeout_s=0.5)
  assert r.status == "timeout" and "session terminated" in r.stderr
  r = ex(runner, pool, "state", "t")  # fresh session, state lost, no hang
  assert r.status == "error" and "NameError" in r.stderr
  assert ex(runner, pool, "print('alive')", "t").stdout == "alive\n"
  runner.run(pool.close_session("t"))


@pytest.mark.parametrize(
  "code,status",
  [
    ("import os\nos._exit(0)", "error"),
    ("bytearray(10**11)", "error"),  # refused before any use: the program's own MemoryError
    ("import os\nos.close(3)\nos.close(4)", "error"),
    ("import os\nos.write(4, b'garbage that is not a frame')", None),
  ],
)
def test_session_crash_is_reported_not_hung(runner, pool, code, status):
  ex(runner, pool, "v = 1", "c")
  t0 = time.monotonic()
  r = ex(runner, pool, code, "c", timeout_s=2.0)
  assert time.monotonic() - t0 < 10
  if status is not None:
    assert r.status == status, r
  r = ex(runner, pool, "print('next call answers')", "c")
  assert r.status == "ok" and r.stdout == "next call answers\n"
  runner.run(pool.close_session("c"))


def test_session_escapee_killed_on_close(runner, pool):
  ex(
    runner,
    pool,
    "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
    "    if os.fork() == 0:\n        time.sleep(1000)\n    os._exit(0)\nos.wait()",
    "e",
  )
  assert sandbox_pids(*pool_uid_range(pool))  # session process + escapee are alive
  runner.run(pool.close_session("e"))
  deadline = time.monotonic() + 3
  while sandbox_pids(*pool_uid_range(pool)) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert sandbox_pids(*pool_uid_range(pool)) == []


def test_run_function_returns_value(runner, pool):
  assert runner.run(pool.run_function(add, 2, 3, scale=4)) == 20
  assert runner.run(pool.run_function(sympy_equal, "(x+1)**2", "x**2+2*x+1")) is True
  assert runner.run(pool.run_function(truncate_middle, "abcdefghij" * 3, 20)) == truncate_middle(
    "abcdefghij" * 3, 20
  )


def test_run_function_is_isolated(runner, pool):
  uid, env = runner.run(pool.run_function(whoami_and_env))
  assert "HF_TOKEN" not in env and env.get("CUDA_VISIBLE_DEVICES") == ""
  if pool.isolation_level != "rlimits":
    assert uid != os.getuid()


def test_run_function_failures(runner, pool):
  t0 = time.monotonic()
  with pytest.raises(FunctionRunError) as e:
    runner.run(pool.run_function(spin_forever, timeout_s=0.5))
  assert e.value.status == "timeout" and time.monotonic() - t0 < 30  # a hang guard, no timing
  with pytest.raises(FunctionRunError) as e:
    runner.run(pool.run_function(raise_value_error, "no good"))
  assert e.value.status == "error" and "ValueError: no good" in e.value.detail
  with pytest.raises(FunctionRunError) as e:
    runner.run(pool.run_function(hog_memory))
  # Refused before any use: the function's own MemoryError, not an observed limit (issue 27).
  assert e.value.status == "error" and "MemoryError" in e.value.detail
  with pytest.raises(TypeError, match="module-level picklable"):
    runner.run(pool.run_function(lambda: 1))
