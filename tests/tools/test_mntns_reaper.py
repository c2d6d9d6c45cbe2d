"""Each call's mount namespace (its private scratch) is made by the template and dropped by the
template's reaper once the call is gone, so the kernel's teardown of it (an expedited RCU grace
period) is waited in the reaper, not in the call's exit (issue 40's trivial-call throughput;
rstar_jax/tools/README.md). What the kernel shows is checked, at every level with a per-call
mount namespace: who holds each namespace, the template's own namespace, the slot's memory
charge, and what a stopped or killed reaper changes (nothing but speed)."""

import asyncio
import os
import signal
import time

import pytest
from pool_helpers import (
  level_pool,
  template_children,
  template_host_pid,
  use_level_runner,
)

from rstar_jax.tools import sandbox_template

runner = use_level_runner()

OWN_NS = "import os\nprint(os.readlink('/proc/self/ns/mnt'))"
SLOT = "print([l.rsplit('/', 1)[-1] for l in open('/proc/self/cgroup') if ':memory:' in l][0])"


def _private_scratch(pool):
  if pool.isolation_level == "rlimits":
    pytest.skip("no per-call mount namespace at the rlimits level (calls share the host's)")


def _reaper(pool):
  found = template_children(pool, sandbox_template.MNTNS_REAPER_NAME.decode())
  assert len(found) == 1, found
  return found[0]


def _held(pid):
  """The namespaces process `pid` holds descriptors of (`mnt:[inode]` strings)."""
  out = set()
  for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
      link = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
      continue
    if link.startswith("mnt:["):
      out.add(link)
  return out


def _eventually(pred, what, seconds=15.0):
  deadline = time.monotonic() + seconds
  while not pred():
    assert time.monotonic() < deadline, what
    time.sleep(0.05)


def _ok(pool, code, **kw):
  r = runner_of(pool).run(pool.execute(code, **kw))
  assert r.status == "ok", r
  return r.stdout.strip()


_RUNNERS = {}


def runner_of(pool):
  return _RUNNERS[id(pool)]


def test_the_reaper_holds_each_calls_namespace_until_the_call_is_gone(runner, lpool):
  """While a session lives, the template's reaper holds a descriptor of its mount namespace
  (so the session's exit is never the namespace's last reference); once it is closed, and
  after each plain call, the reaper lets go. Every call has a namespace of its own; the
  template is back in its own after each fork."""
  _private_scratch(lpool)
  _RUNNERS[id(lpool)] = runner
  tpid, reaper = template_host_pid(lpool), _reaper(lpool)
  own = os.readlink(f"/proc/{tpid}/ns/mnt")
  try:
    sess = _ok(lpool, OWN_NS, session_id="held")
    assert sess.startswith("mnt:[") and sess != own, (sess, own)
    # Sent right after the fork; the reaper takes it from its socket in its own time.
    _eventually(lambda: sess in _held(reaper), f"{sess} not held by the reaper: {_held(reaper)}")
    assert _ok(lpool, OWN_NS, session_id="held") == sess  # the session keeps its namespace
    # Three at once (one after another, a namespace's number is free again for the next).
    code = "import time; time.sleep(1.0)\n" + OWN_NS

    async def three():
      return await asyncio.gather(*(lpool.execute(code) for _ in range(3)))

    rs = runner.run(three())
    assert [r.status for r in rs] == ["ok"] * 3, rs
    calls = [r.stdout.strip() for r in rs]
  finally:
    runner.run(lpool.close_session("held"))
  assert len(set(calls) | {sess, own}) == 5, (calls, sess, own)
  assert os.readlink(f"/proc/{tpid}/ns/mnt") == own
  _eventually(
    lambda: not (set(calls) | {sess}) & _held(reaper),
    f"the reaper still holds a finished call's namespace: {_held(reaper)}",
  )


@pytest.fixture(scope="module", params=("namespaces", "pidns", "uid"))
def rpool(level_runner, request):
  """A one-template pool per level with a per-call mount namespace (its reaper is stopped and
  killed by the test)."""
  p = level_pool(level_runner, request.param, num_workers=8, preload=("json",), timeout_s=20.0)
  _RUNNERS[id(p)] = level_runner
  yield p
  level_runner.run(p.close())


def _slot_usage(pool, slot):
  """memory.usage_in_bytes of the pool's call cgroup named `slot` (v1) or memory.current (v2)."""
  for base in pool._cg.base.values():
    for root, dirs, _ in os.walk(base):
      if slot in dirs:
        for name in ("memory.usage_in_bytes", "memory.current"):
          path = os.path.join(root, slot, name)
          if os.path.exists(path):
            with open(path) as f:
              return int(f.read())
  raise AssertionError(f"no cgroup {slot} under {pool._cg.base}")


def test_a_slot_is_reused_only_once_its_namespace_is_gone(rpool):
  """A call's tmpfs pages stay charged to its cgroup slot until the reaper drops its namespace:
  with the reaper stopped (SIGSTOP), the slot keeps them and no later call is given it (calls
  go on in fresh slots); resumed, the reaper frees them and the slot is reused. Killed, the
  template goes on without it (each call's exit tears its namespace down, as before the
  reaper), same process, calls and sessions unaffected."""
  _private_scratch(rpool)
  if rpool._cg is None:
    pytest.skip(f"no writable memory + pids cgroup here: {rpool.memory_bound}")
  tpid, reaper = template_host_pid(rpool), _reaper(rpool)
  os.kill(reaper, signal.SIGSTOP)
  try:
    fill = (  # 24 MiB in files of 48 KiB (RLIMIT_FSIZE caps each file at max_output_bytes)
      "for i in range(512):\n  open(f'/tmp/f{i}', 'wb').write(b'x' * (48 << 10))\n" + SLOT
    )
    slot = _ok(rpool, fill)
    assert _slot_usage(rpool, slot) >= 24 << 20  # the finished call's tmpfs, still there
    later = [_ok(rpool, SLOT) for _ in range(3)]
    assert slot not in later, (slot, later)
    assert _slot_usage(rpool, slot) >= 24 << 20
  finally:
    os.kill(reaper, signal.SIGCONT)
  _eventually(lambda: _slot_usage(rpool, slot) < 16 << 20, "the tmpfs pages were never freed")
  # Back in the free list: calls enough to take every free slot at once get it again.
  code = "import time; time.sleep(1.0)\n" + SLOT

  async def eight():
    return await asyncio.gather(*(rpool.execute(code) for _ in range(8)))

  rs = runner_of(rpool).run(eight())
  assert [r.status for r in rs] == ["ok"] * 8, rs
  assert slot in {r.stdout.strip() for r in rs}, (slot, rs)

  os.kill(reaper, signal.SIGKILL)
  _eventually(lambda: not os.path.exists(f"/proc/{reaper}"), "the reaper was not reaped")
  outs = [_ok(rpool, "print(6 * 7)") for _ in range(8)]
  assert outs == ["42"] * 8
  _ok(rpool, "x = 5", session_id="after")
  assert _ok(rpool, "print(x)", session_id="after") == "5"
  runner_of(rpool).run(rpool.close_session("after"))
  assert template_host_pid(rpool) == tpid
