"""Shared fixtures for the code-tool tests: one event loop and one warm pool per module, a pool
per isolation level for the threat batteries, and the summary line counting skipped threat
tests (`RSTAR_REQUIRE_NAMESPACES=1` turns any skip at the namespaces level into a failure)."""

import os
import sys

import pytest

from rstar_jax.tools.code_pool import ISOLATION_LEVELS, CodePool

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pool_helpers import SECRET, Runner, level_pool  # noqa: E402

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
os.environ["HF_TOKEN"] = SECRET
os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"


@pytest.fixture(scope="module")
def runner():
  r = Runner()
  yield r
  r.close()


@pytest.fixture(scope="module")
def pool(runner):
  # run_function tests pickle functions of these test modules by reference: let the sandbox
  # import them.
  p = CodePool(num_workers=4, num_templates=2, timeout_s=4.0, extra_ro_binds=(TESTS_DIR,))
  runner.run(p.start())
  yield p
  runner.run(p.close())


@pytest.fixture(scope="session")
def level_runner():
  """The event loop of the per-level pools, shared by every threat module (one start per level
  for the whole run instead of one per module)."""
  r = Runner()
  yield r
  r.close()


@pytest.fixture(scope="session", params=ISOLATION_LEVELS)
def lpool(level_runner, request):
  """One pool per isolation level (default config: subprocesses blocked). Modules using it
  take `runner` from `level_runner` (see `pool_helpers.use_level_runner`)."""
  p = level_pool(level_runner, request.param)
  yield p
  level_runner.run(p.close())


# ---------------------------------------------------------------------------------------------
# threat-test skip accounting
_THREAT_SKIPS = []


def _is_threat(nodeid):
  return "/tools/test_threats" in nodeid or nodeid.startswith("test_threats")


def pytest_runtest_logreport(report):
  if report.skipped and _is_threat(report.nodeid):
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    _THREAT_SKIPS.append((report.nodeid, reason.removeprefix("Skipped: ")))


def _namespaces_skips():
  return [(n, r) for n, r in _THREAT_SKIPS if "[namespaces" in n or "-namespaces" in n]


def pytest_terminal_summary(terminalreporter):
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
