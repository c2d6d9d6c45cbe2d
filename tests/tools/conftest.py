"""Shared fixtures for the code-tool tests: one event loop and one warm pool per module."""
import os
import sys

import pytest

from rstar_jax.tools.code_pool import CodePool

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pool_helpers import SECRET, Runner  # noqa: E402

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
