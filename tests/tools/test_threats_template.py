"""Threat classes 4 and 6: the shared template survives anything a call does, session
bookkeeping stays right across template deaths, retries and cancellations, threads die with
the call, and every fallback level imports what it should, leaves no orphan when its template
is killed and recovers without FileExistsError."""

import asyncio
import glob
import os
import pathlib
import signal
import tempfile
import time

import pytest
from pool_helpers import descendants, level_pool, pool_uid_range, sandbox_pids, use_level_runner

from rstar_jax.tools import wire
from rstar_jax.tools.code_pool import ISOLATION_LEVELS

# 1,200 levels: past Python's recursion limit (shutil.rmtree recursed) and, with 4-char names,
# past PATH_MAX; deeper only costs time on the host's overlay filesystem.
DEEP = (
  "import os\nhome = os.getcwd()\nos.mkdir('top')\nos.chdir('top')\n"
  "for i in range(1200):\n    os.mkdir('a')\n    os.chdir('a')\n"
  "    open('f', 'w').write('x')\nos.symlink('/usr', 'escape')\nos.chdir(home)\n"
  "os.chmod('top', 0)\nprint('built')"
)

runner = use_level_runner()


def _wait_no_sandbox_pids(pool, seconds=5.0):
  deadline = time.monotonic() + seconds
  while sandbox_pids(*pool_uid_range(pool)) and time.monotonic() < deadline:
    time.sleep(0.05)
  return sandbox_pids(*pool_uid_range(pool))


# At "rlimits" the scratch dirs live on the host's /tmp, where 1,200 nested mkdirs take seconds:
# that level runs in the slow tier (every root level gives each call its own tmpfs).
_HOST_FS = pytest.mark.slow


@pytest.mark.parametrize(
  "level",
  [pytest.param(lv, marks=_HOST_FS if lv == "rlimits" else ()) for lv in ISOLATION_LEVELS],
)
def test_deep_tree_does_not_kill_the_template(runner, level):
  # 1,200 levels, unreadable top, a symlink out: the template's cleanup must neither recurse,
  # nor follow the link, nor die.
  pool = level_pool(runner, level, preload=())
  try:
    r = runner.run(pool.execute(DEEP, timeout_s=30.0))
    assert r.status == "ok" and r.stdout == "built\n", r
    r = runner.run(pool.execute("print('next')"))
    assert (r.status, r.stdout) == ("ok", "next\n")
    assert pool._templates[0].restarts == 0
    assert os.path.exists("/usr/bin")
  finally:
    runner.run(pool.close())


def test_iterative_rmtree_handles_depth_links_and_modes(tmp_path):
  # On tmpfs when there is one (fast); the walk is the same on any filesystem.
  base = tempfile.mkdtemp(dir="/dev/shm") if os.access("/dev/shm", os.W_OK) else str(tmp_path)
  root = pathlib.Path(base) / "t"
  root.mkdir()
  fd = os.open(root, os.O_RDONLY)
  for _ in range(1200):  # deeper than the recursion limit and (6 kB) than PATH_MAX
    os.mkdir("aaaa", dir_fd=fd)
    os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    child = os.open("aaaa", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = child
  os.close(fd)
  outside = tmp_path / "keep.txt"
  outside.write_text("keep")
  os.symlink(outside, root / "link")
  os.symlink(tmp_path, root / "dirlink")
  os.chmod(root / "aaaa", 0)
  assert wire.rmtree(str(root))
  assert not root.exists() and outside.read_text() == "keep"
  wire.rmtree(base)


def test_cancelled_session_call_does_not_leave_it_busy(runner, lpool):
  sid = "cancel-me"
  runner.run(lpool.execute("kept = 1", session_id=sid))

  async def cancel_then_call():
    task = asyncio.ensure_future(
      lpool.execute("import time\ntime.sleep(30)", session_id=sid, timeout_s=60.0)
    )
    for _ in range(200):  # cancel once the template really runs it
      await asyncio.sleep(0.02)
      if any(t.pending for t in lpool._templates):
        break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
      await task
    t0 = time.monotonic()
    r = await lpool.execute("print('after cancel')", session_id=sid, timeout_s=5.0)
    return r, time.monotonic() - t0

  r, dt = runner.run(cancel_then_call())
  assert r.status == "ok" and r.stdout == "after cancel\n", r
  assert "session restarted" in r.stderr and dt < 10
  assert runner.run(lpool.close_session(sid)) is True


def test_threads_die_with_the_call(runner, lpool):
  # A plain call: its process exits, so do its threads.
  r = runner.run(
    lpool.execute(
      "import threading, time\nthreading.Thread(target=time.sleep, "
      "args=(30,), daemon=True).start()\nprint('started')"
    )
  )
  assert r.stdout == "started\n"
  if lpool.isolation_level != "rlimits":
    assert _wait_no_sandbox_pids(lpool) == []
  # A session call: a thread still running when the call ends ends the session, said so.
  sid = "threads"
  r = runner.run(
    lpool.execute(
      "import threading, time\nthreading.Thread(target=time.sleep, "
      "args=(30,), daemon=True).start()",
      session_id=sid,
    )
  )
  assert r.status == "error" and "thread(s) still running" in r.stderr, r
  # Non-daemon threads are joined within the call, like at the end of a script.
  r = runner.run(
    lpool.execute(
      "import threading, time\nout = []\nt = threading.Thread("
      "target=lambda: out.append(1))\nt.start()",
      session_id=sid,
    )
  )
  assert r.status == "ok", r
  assert runner.run(lpool.execute("print(out)", session_id=sid)).stdout == "[1]\n"
  runner.run(lpool.close_session(sid))


def test_stdlib_and_preloaded_importable(runner, lpool):
  r = runner.run(
    lpool.execute(
      "import json, csv, fractions, decimal, statistics, email.mime.text, sqlite3, "
      "encodings.idna\nimport numpy, sympy\nprint(json.dumps(sorted(numpy.arange(3).tolist())), "
      "sympy.factorint(12))"
    )
  )
  assert (r.status, r.stdout) == ("ok", "[0, 1, 2] {2: 2, 3: 1}\n"), r


@pytest.mark.parametrize("level", ISOLATION_LEVELS)
def test_killed_template_leaves_no_orphans_and_recovers(runner, level):
  pool = level_pool(runner, level, num_workers=4, timeout_s=20.0, preload=())
  try:
    tpl = pool._templates[0]
    runner.run(pool.execute("a = 1", session_id="keep"))

    async def kill_mid_call():
      task = asyncio.ensure_future(pool.execute("import time\ntime.sleep(60)", timeout_s=30.0))
      for _ in range(200):
        await asyncio.sleep(0.02)
        if sandbox_pids(*pool_uid_range(pool)) and len(tpl.pending) == 1:
          break
      root = tpl.proc.pid
      tree = descendants(root)
      os.killpg(root, signal.SIGKILL)
      return task, tree

    task, tree = runner.run(kill_mid_call())
    if level != "rlimits":  # rlimits runs calls as the host uid: no uid to look for
      assert _wait_no_sandbox_pids(pool) == [], "sandbox processes outlived their template"
    deadline = time.monotonic() + 5
    while (
      any(
        os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"
        for p in tree
      )
      and time.monotonic() < deadline
    ):
      time.sleep(0.05)
    alive = [
      p
      for p in tree
      if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"
    ]
    assert alive == [], f"processes of the killed template survive: {alive}"
    task.cancel()
    # Recovers: fresh calls work (no FileExistsError from a reused scratch name), the session
    # says it restarted, and close_session finds it where the retry put it.
    for i in range(3):
      r = runner.run(pool.execute(f"print({i})"))
      assert (r.status, r.stdout) == ("ok", f"{i}\n"), r
    r = runner.run(pool.execute("print('fresh')", session_id="keep"))
    assert r.stdout == "fresh\n" and "session restarted" in r.stderr, r
    assert runner.run(pool.close_session("keep")) is True
  finally:
    tmpdir = pool._tmpdir
    runner.run(pool.close())
  assert tmpdir is None or not os.path.exists(tmpdir)


@pytest.mark.slow
@pytest.mark.parametrize("level", ("pidns", "uid"))
def test_close_after_deep_tree_leaves_no_scratch(runner, level):
  pool = level_pool(runner, level, preload=())
  try:
    code = (
      "import os\nfor i in range(1200):\n    os.mkdir('aaaa')\n    os.chdir('aaaa')\n"
      "import time\ntime.sleep(30)"
    )
    runner.run(pool.execute("x = 1", session_id="deep"))
    r = runner.run(pool.execute(code, session_id="deep", timeout_s=1.5))
    assert r.status == "timeout"
    runner.run(pool.execute(code.replace("time.sleep(30)", "pass"), session_id="live"))
  finally:
    tmpdir = pool._tmpdir
    runner.run(pool.close())  # must not raise, and must remove everything
  assert not os.path.exists(tmpdir)
  assert tmpdir not in glob.glob("/tmp/code_pool_*")
