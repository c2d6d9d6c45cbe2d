"""Test-wide environment: 8 fake CPU devices for sharding tests, no hub access. Also what a
parallel run (pytest-xdist, `scripts/test.sh`) needs: tests marked `alone` run with no other
test beside them, the modules holding slow tests are handed out first, and the count of
skipped threat tests is summed over every worker."""

import contextlib
import fcntl
import os
import shutil
import tempfile
import time

import pytest

# Must happen before jax is imported anywhere in the test process (every xdist worker loads
# this conftest before any test module, so each worker gets the 8 devices too).
#
# Quick compiles: most of the suite's CPU time is XLA:CPU compiling thousands of tiny programs
# that then run for milliseconds, so the tests compile with little optimization (JAX's own
# switch for that case: LLVM at -O0 without its expensive passes) and with XLA:CPU's older
# elemental emitters, which compile faster than its MLIR fusion emitters: about half the CPU
# time of a compile-heavy test (docs/testing.md). The programs compute the same functions; the
# test of what XLA makes of a program (the sampler's HLO structure) compiles it as users do.
# RSTAR_TEST_FAST_COMPILE=0 runs everything with XLA's defaults. A test that starts a process
# on one CPU device gives it XLA_FLAGS=$RSTAR_TEST_XLA_FLAGS (these flags without the 8
# devices); JAX_DISABLE_MOST_OPTIMIZATIONS reaches every subprocess by itself.
_FAST_COMPILE = os.environ.get("RSTAR_TEST_FAST_COMPILE", "1") != "0"
os.environ.setdefault(
  "RSTAR_TEST_XLA_FLAGS", "--xla_cpu_use_fusion_emitters=false" if _FAST_COMPILE else ""
)
os.environ.setdefault(
  "XLA_FLAGS",
  f"--xla_force_host_platform_device_count=8 {os.environ['RSTAR_TEST_XLA_FLAGS']}".strip(),
)
if _FAST_COMPILE:
  os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ---------------------------------------------------------------------------------------------
# one XLA compilation cache for the whole run
def _start_compilation_cache():
  """JAX's persistent compilation cache in a directory made for this run, shared by every xdist
  worker and every process a test starts (launchers, multi-process drivers inherit the
  environment): a program compiled again in another module, worker or subprocess (a launcher
  run a second time to test its resume) is read back instead. Made by the first process that
  loads this conftest
  (the xdist controller, or the one process of a serial run), which removes it at the end;
  workers inherit it. Never a fixed path: a cache outliving its run could serve another tree.
  Entries are keyed by the program, jaxlib and XLA flags, yet a hit is not always bit-for-bit
  what a fresh compile gives: two undisturbed async chaos runs, the first compiling and the second
  reading the cache, ended with different bytes (equal without the cache, 2026-12-07). So tests
  that must see XLA compile (a module dump) or compare the bytes of separate processes' runs
  drop the variable (the HLO-structure test, the chaos benchmark's runs).
  RSTAR_TEST_COMPILATION_CACHE=0 turns it off; a JAX_COMPILATION_CACHE_DIR set beforehand is
  used as it is and kept."""
  if os.environ.get("RSTAR_TEST_COMPILATION_CACHE", "1") == "0":
    return None
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return None  # the caller's (or, in an xdist worker, the controller's): not ours to remove
  path = tempfile.mkdtemp(prefix="rstar-tests-xla-cache-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = path
  # Every program, however small or quick to compile: the tiny test models compile in
  # milliseconds each, but there are thousands of them.
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
  return path


_OWN_CACHE_DIR = _start_compilation_cache()
_CACHE_EVENTS = {"requests": 0, "hits": 0}  # in this process (a test process: worker or serial)
_CACHE_TOTALS = {"requests": 0, "hits": 0}  # summed over the workers, in the controller


def _count_cache_event(event, **kwargs):
  if event == "/jax/compilation_cache/compile_requests_use_cache":
    _CACHE_EVENTS["requests"] += 1
  elif event == "/jax/compilation_cache/cache_hits":
    _CACHE_EVENTS["hits"] += 1


def _runs_tests(config) -> bool:
  """This process runs tests: an xdist worker, or a run without xdist's controller."""
  if os.environ.get("PYTEST_XDIST_WORKER"):
    return True
  return getattr(config.option, "dist", "no") == "no"


def pytest_configure(config):
  if _runs_tests(config) and os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    import jax  # the tests import it anyway; its listener counts this process's cache hits

    jax.monitoring.register_event_listener(_count_cache_event)


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
  """The controller removes its run's lock files and compilation cache once every worker is
  done (no litter in /tmp)."""
  for base in _LOCK_BASES:
    for suffix in (".gate", ".rw"):
      with contextlib.suppress(FileNotFoundError):
        os.unlink(base + suffix)
  if _OWN_CACHE_DIR:
    shutil.rmtree(_OWN_CACHE_DIR, ignore_errors=True)


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


def _collect_cache_counts(session):
  """A worker hands its cache counts to the controller (summed there for the summary line)."""
  for k, v in _CACHE_EVENTS.items():
    _CACHE_TOTALS[k] += v
  if hasattr(session.config, "workeroutput"):
    session.config.workeroutput["xla_cache"] = dict(_CACHE_EVENTS)


_NODES_DOWN = {}  # in the controller: worker id -> seconds after the session started
_SESSION_START = []


def pytest_sessionstart(session):
  _SESSION_START.append(time.monotonic())


@pytest.hookimpl(optionalhook=True)  # an xdist hook, in the controller
def pytest_testnodedown(node, error):
  for k, v in getattr(node, "workeroutput", {}).get("xla_cache", {}).items():
    _CACHE_TOTALS[k] += v
  if _SESSION_START:
    _NODES_DOWN[node.gateway.id] = time.monotonic() - _SESSION_START[0]


def pytest_terminal_summary(terminalreporter):
  if len(_NODES_DOWN) > 1:  # a worker done long before the other: the module order is off
    ends = ", ".join(f"{w} {t:.0f} s" for w, t in sorted(_NODES_DOWN.items()))
    terminalreporter.write_line(f"workers finished after: {ends}")
  if _CACHE_TOTALS["requests"]:
    terminalreporter.write_line(
      f"XLA compilation cache (tests/conftest.py): {_CACHE_TOTALS['hits']} of "
      f"{_CACHE_TOTALS['requests']} compiles in the test processes were cache hits "
      "(subprocesses not counted)"
    )
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


def _save_coverage():
  """Under coverage's process hook (``COVERAGE_PROCESS_START``, docs/testing.md), this process's
  data is written now: pytest-xdist kills a worker still exiting 10 s after the session ends,
  before coverage's own save at exit (a whole measured run lost both workers' data so)."""
  if not os.environ.get("COVERAGE_PROCESS_START"):
    return
  import coverage  # only when measuring coverage: not a dependency of the suite

  cov = coverage.Coverage.current()
  if cov is not None:
    cov.save()


def pytest_sessionfinish(session, exitstatus):
  _save_coverage()
  _collect_cache_counts(session)
  if os.environ.get("RSTAR_REQUIRE_NAMESPACES") == "1" and _namespaces_skips() and exitstatus == 0:
    session.exitstatus = 1
