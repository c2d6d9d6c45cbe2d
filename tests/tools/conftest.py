"""Shared fixtures for the code-tool tests: one event loop and one warm pool per module, a pool
per isolation level for the threat batteries."""

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


# The threat-test skip accounting (the summary line, RSTAR_REQUIRE_NAMESPACES=1) is in
# tests/conftest.py: under xdist only the top-level conftest runs in the controller process.
