"""Test-wide environment: 8 fake CPU devices for sharding tests, no hub access. Also what a
parallel run (pytest-xdist, `scripts/test.sh`) needs: tests marked `alone` run with no other
test beside them, the modules holding slow tests are handed out first, and the count of
skipped threat tests is summed over every worker."""

import contextlib
import fcntl
import os
import tempfile

import pytest

# Must happen before jax is imported anywhere in the test process (every xdist worker loads
# this conftest before any test module, so each worker gets the 8 devices too).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ---------------------------------------------------------------------------------------------
# parallel runs
def _lock_base(testrunuid: str) -> str:
  return os.path.join(tempfile.gettempdir(), f"rstar-tests-{testrunuid}")


def _run_lock_base():
  """Path prefix of this run's lock files, shared by its xdist workers; None outside xdist."""
  uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
  if not os.environ.get("PYTEST_XDIST_WORKER") or not uid:
    return None
  return _lock_base(uid)


_LOCK_BASES = set()  # in the xdist controller: the lock-file prefixes of its runs


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown where xdist is not installed
def pytest_configure_node(node):
  _LOCK_BASES.add(_lock_base(node.workerinput["testrunuid"]))


def pytest_unconfigure(config):
  """The controller removes its run's lock files once every worker is done (no litter in /tmp)."""
  for base in _LOCK_BASES:
    for suffix in (".gate", ".rw"):
      with contextlib.suppress(FileNotFoundError):
        os.unlink(base + suffix)


@contextlib.contextmanager
def _machine_lock(base: str, alone: bool):
  """A fair readers-writer lock over two flock files: every test holds `rw` shared, an `alone`
  test holds it exclusively. The `gate` is held while waiting for `rw`, so once an `alone`
  test waits no other test starts before it (the other worker cannot starve it)."""
  with open(base + ".gate", "a") as gate, open(base + ".rw", "a") as rw:
    fcntl.flock(gate, fcntl.LOCK_EX)
    try:
      fcntl.flock(rw, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    finally:
      if not alone:
        fcntl.flock(gate, fcntl.LOCK_UN)
    try:
      yield
    finally:
      fcntl.flock(rw, fcntl.LOCK_UN)
      if alone:
        fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """Under xdist, a test marked `alone` (it needs the cores to itself: CPU time against wall
  time) waits until the other workers' tests end, and they wait for it; setup and teardown of
  its fixtures included."""
  base = _run_lock_base()
  if base is None:
    yield
    return
  with _machine_lock(base, item.get_closest_marker("alone") is not None):
    yield


def pytest_itemcollected(item):
  """A `long` test is `slow` too, so the fast tier (-m "not slow") never runs the long chains."""
  if item.get_closest_marker("long") is not None and item.get_closest_marker("slow") is None:
    item.add_marker(pytest.mark.slow)


def pytest_collection_modifyitems(config, items):
  """Under xdist, the modules that hold `slow` tests first (most slow tests first), the rest in
  their usual order: a long module handed out last would leave one worker running alone at the
  end. (`scripts/test.sh` distributes whole modules, --dist loadfile, in this order.)"""
  if not os.environ.get("PYTEST_XDIST_WORKER"):
    return
  slow = {}
  for it in items:
    n = slow.setdefault(it.nodeid.split("::")[0], 0)
    slow[it.nodeid.split("::")[0]] = n + (it.get_closest_marker("slow") is not None)
  order = {m: i for i, m in enumerate(slow)}
  items.sort(key=lambda it: (-slow[it.nodeid.split("::")[0]], order[it.nodeid.split("::")[0]]))


# ---------------------------------------------------------------------------------------------
# threat-test skip accounting (here, not in tests/tools/conftest.py: under xdist only the
# top-level conftest runs in the controller process, which sees every worker's reports)
_THREAT_SKIPS = []
_THREAT_SEEN = []  # any report of a threat test: the summary line is printed when they ran


def _is_threat(nodeid):
  return "/tools/test_threats" in nodeid or nodeid.startswith("test_threats")


def pytest_runtest_logreport(report):
  if report.when == "setup" and _is_threat(report.nodeid):
    _THREAT_SEEN.append(report.nodeid)
  if report.skipped and _is_threat(report.nodeid):
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    _THREAT_SKIPS.append((report.nodeid, reason.removeprefix("Skipped: ")))


def _namespaces_skips():
  return [(n, r) for n, r in _THREAT_SKIPS if "[namespaces" in n or "-namespaces" in n]


def pytest_terminal_summary(terminalreporter):
  if not _THREAT_SEEN:
    return
  reasons = {}
  for _, r in _THREAT_SKIPS:
    reasons[r] = reasons.get(r, 0) + 1
  detail = "; ".join(f"{n}x {r}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
  terminalreporter.write_line(
    f"threat tests skipped: {len(_THREAT_SKIPS)}" + (f" ({detail})" if detail else "")
  )
  if os.environ.get("RSTAR_REQUIRE_NAMESPACES") == "1" and _namespaces_skips():
    terminalreporter.write_line(
      "RSTAR_REQUIRE_NAMESPACES=1: threat tests skipped at the "
      "namespaces level: " + ", ".join(n for n, _ in _namespaces_skips())
    )


def pytest_sessionfinish(session, exitstatus):
  if os.environ.get("RSTAR_REQUIRE_NAMESPACES") == "1" and _namespaces_skips() and exitstatus == 0:
    session.exitstatus = 1
