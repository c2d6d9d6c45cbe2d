"""Barriers (`primary.sync`) must be passed by every process on every path: one skipped by a
process that decided on its own ("the file is already there") pairs its next collective with
another process's barrier (an RNG key that "differed between processes" in one CI run was
exactly that: process 0's barrier hash met process 1's device_put check)."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_slow_process_still_waits_for_the_tokenizer_barrier(tmp_path):
  env = dict(
    os.environ,
    PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    JAX_PLATFORMS="cpu",
    PYTHONUNBUFFERED="1",
    LOCAL_CLUSTER_PYTHON=sys.executable,
  )
  for k in ("RSTAR_COORDINATOR", "RSTAR_NUM_PROCESSES", "RSTAR_PROCESS_ID", "XLA_FLAGS"):
    env.pop(k, None)
  driver = os.path.join(REPO, "tests", "distributed", "barrier_driver.py")
  cmd = ["bash", os.path.join(REPO, "scripts", "local_cluster.sh"), "2", "1", "--"]
  cmd += [sys.executable, driver, str(tmp_path)]
  out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
  text = out.stdout + out.stderr
  assert out.returncode == 0, text[-3000:]
  assert text.count("barrier ok") == 2, text[-3000:]
