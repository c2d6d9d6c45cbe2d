"""MoE routes survive the multi-process gather: 2 JAX processes (scripts/local_cluster.sh) make
their share of the groups and all-gather them (`rollout.groups.make_groups`); each checks
every trajectory's routes against the known function (`routes_gather_driver.py`)."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_two_processes_gather_trajectories_with_their_routes():
  env = dict(
    os.environ,
    PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    JAX_PLATFORMS="cpu",
    LOCAL_CLUSTER_PYTHON=sys.executable,
  )
  for k in ("RSTAR_COORDINATOR", "RSTAR_NUM_PROCESSES", "RSTAR_PROCESS_ID"):
    env.pop(k, None)
  driver = os.path.join(REPO, "tests", "distributed", "routes_gather_driver.py")
  cluster = os.path.join(REPO, "scripts", "local_cluster.sh")
  out = subprocess.run(
    ["bash", cluster, "2", "1", "--", sys.executable, driver],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    cwd=REPO,
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  for i in range(2):
    assert f"[{i}] routes ok: process {i} of 2" in out.stdout, out.stdout[-3000:]
