"""Tool semantics: stdout, stdin, last-expression repr, tracebacks, exits, encodings."""

import pytest
from pool_helpers import bound_back_names

from rstar_jax.tools.code_pool import ExecResult, PoolConfig


def ex(runner, pool, code, stdin="", **kw):
  return runner.run(pool.execute(code, stdin, **kw))


def test_isolation_level_reported(pool):
  assert pool.isolation_level in ("namespaces", "pidns", "uid", "rlimits")
  assert pool.isolation_description


def test_stdout(runner, pool):
  r = ex(runner, pool, "print('hello')\nprint(2 + 3)")
  assert (r.status, r.stdout, r.stderr) == ("ok", "hello\n5\n", "")
  assert r.exit_code == 0 and r.duration_s > 0


def test_stdin_lines_and_sys_stdin(runner, pool):
  r = ex(runner, pool, "a = int(input())\nb = int(input())\nprint(a * b)", "6\n7\n")
  assert (r.status, r.stdout) == ("ok", "42\n")
  r = ex(runner, pool, "import sys\nprint(sum(map(int, sys.stdin.read().split())))", "1 2 3\n4")
  assert r.stdout == "10\n"


def test_last_expression_repr_only_without_stdout(runner, pool):
  r = ex(runner, pool, "x = [1, 2]\nx + [3]")
  assert (r.status, r.stdout) == ("ok", "[1, 2, 3]\n")
  r = ex(runner, pool, "'text'")
  assert r.stdout == "'text'\n"
  r = ex(runner, pool, "print('first')\n41 + 1")
  assert r.stdout == "first\n"  # stdout present: no repr
  r = ex(runner, pool, "None")
  assert r.stdout == ""
  r = ex(runner, pool, "import sympy\nx = sympy.Symbol('x')\nsympy.solve(x**2 - 4, x)")
  assert r.stdout == "[-2, 2]\n"


def test_exception_traceback_has_user_line_numbers(runner, pool):
  code = "def f(n):\n    return 10 // n\n\nx = 1\nf(0)\n"
  r = ex(runner, pool, code)
  assert r.status == "error" and r.exit_code == 1
  assert 'File "<code>", line 5, in <module>' in r.stderr
  assert 'File "<code>", line 2, in f' in r.stderr
  assert "return 10 // n" in r.stderr
  assert r.stderr.rstrip().endswith("ZeroDivisionError: integer division or modulo by zero")
  assert "sandbox_template" not in r.stderr  # no executor frames leak into the traceback


def test_stdout_kept_before_error(runner, pool):
  r = ex(runner, pool, "print('partial')\nraise ValueError('bad value')")
  assert r.status == "error" and r.stdout == "partial\n"
  assert "ValueError: bad value" in r.stderr


def test_syntax_error(runner, pool):
  r = ex(runner, pool, "x = 1\ny = (2 +\n")
  assert r.status == "error"
  assert 'File "<code>", line 2' in r.stderr and "SyntaxError" in r.stderr


@pytest.mark.parametrize(
  "code,status,rc",
  [
    ("import sys\nsys.exit(0)", "ok", 0),
    ("import sys\nsys.exit()", "ok", 0),
    ("import sys\nprint('bye')\nsys.exit(3)", "error", 3),
    ("import sys\nsys.exit('fatal message')", "error", 1),
    ("import os\nprint('x', flush=True)\nos._exit(0)", "ok", 0),
    ("import os\nos._exit(7)", "error", 7),
  ],
)
def test_exits(runner, pool, code, status, rc):
  r = ex(runner, pool, code)
  assert (r.status, r.exit_code) == (status, rc), r
  if "fatal message" in code:
    assert "fatal message" in r.stderr
  if "bye" in code:
    assert r.stdout == "bye\n"


def test_unicode_and_binary_output(runner, pool):
  r = ex(runner, pool, "print('π≈3.14159 — 数学 ✓')")
  assert (r.status, r.stdout) == ("ok", "π≈3.14159 — 数学 ✓\n")
  r = ex(runner, pool, "import sys\nsys.stdout.buffer.write(b'ab\\xff\\x00cd')")
  assert r.status == "ok" and r.stdout == "ab\ufffd\x00cd"
  r = ex(runner, pool, "print('\\udcff')")  # lone surrogate: escaped, not a crash
  assert r.status == "ok" and "\\udcff" in r.stdout
  r = ex(runner, pool, "input()", "é\n")
  assert r.stdout == "'é'\n"


def test_empty_and_comment_only_code(runner, pool):
  for code in ("", "   \n", "# just a comment\n"):
    r = ex(runner, pool, code)
    assert (r.status, r.stdout, r.stderr) == ("ok", "", "")


def test_stderr_captured_separately(runner, pool):
  r = ex(runner, pool, "import sys\nprint('out')\nprint('err', file=sys.stderr)")
  assert (r.status, r.stdout, r.stderr) == ("ok", "out\n", "err\n")


def test_execute_many_keeps_order(runner, pool):
  rs = runner.run(
    pool.execute_many(
      [{"code": f"print({i} * {i})"} for i in range(12)] + [{"code": "input()", "stdin": "z"}]
    )
  )
  assert [r.stdout for r in rs[:12]] == [f"{i * i}\n" for i in range(12)]
  assert rs[12].stdout == "'z'\n"
  with pytest.raises(ValueError, match="request 0 has no 'code'"):
    runner.run(pool.execute_many([{"stdin": "x"}]))


def test_bad_arguments_are_clear_errors(runner, pool):
  with pytest.raises(TypeError, match="code must be str"):
    runner.run(pool.execute(b"print(1)"))
  with pytest.raises(ValueError, match=r"timeout_s must be finite and in \(0, 3600\]"):
    runner.run(pool.execute("1", timeout_s=0))
  with pytest.raises(ValueError, match="num_workers"):
    PoolConfig(num_workers=0)
  with pytest.raises(ValueError, match="isolation"):
    PoolConfig(isolation="docker")


def test_each_call_is_a_fresh_interpreter(runner, pool):
  ex(runner, pool, "import builtins\nbuiltins.LEAK = 1\nopen('f.txt', 'w').write('x')")
  skip = bound_back_names()  # a checkout under /tmp, bound back read-only
  r = ex(
    runner,
    pool,
    f"import builtins, os\nprint(hasattr(builtins, 'LEAK'), "
    f"[n for n in os.listdir('.') if n not in {sorted(skip)!r}])",
  )
  assert r.stdout == "False []\n"


def test_exec_result_is_frozen():
  r = ExecResult("ok", "a", "", 0.1)
  with pytest.raises(Exception):
    r.status = "error"


@pytest.mark.parametrize("level", ["namespaces", "pidns", "uid", "rlimits"])
def test_every_isolation_level_runs_the_basics(runner, level):
  from rstar_jax.tools.code_pool import CodePool

  pool = CodePool(num_workers=2, num_templates=1, isolation=level, preload=())
  try:
    runner.run(pool.start())
  except RuntimeError as e:
    pytest.skip(f"{level} not available here: {e}")
  try:
    assert pool.isolation_level == level
    rs = runner.run(
      pool.execute_many(
        [
          {"code": "print(input())", "stdin": "hi"},
          {"code": "1/0"},
          {"code": "import time\ntime.sleep(60)", "timeout_s": 0.3},
          {"code": "6 * 7"},
        ]
      )
    )
    assert [r.status for r in rs] == ["ok", "error", "timeout", "ok"]
    assert rs[0].stdout == "hi\n" and rs[3].stdout == "42\n"
  finally:
    runner.run(pool.close())
