"""Single-process behaviour of the multi-process helpers, and the local cluster runner."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from rstar_jax.distributed import hostdata

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(REPO, "scripts", "local_cluster.sh")


@pytest.mark.parametrize("n,count", [(0, 2), (1, 2), (2, 2), (7, 3), (8, 4), (5, 8)])
def test_local_indices_split_contiguously_and_cover_everything(n, count):
  parts = [hostdata.local_indices(n, process_index=i, process_count=count) for i in range(count)]
  assert [j for p in parts for j in p] == list(range(n))
  sizes = [len(p) for p in parts]
  assert max(sizes) - min(sizes) <= 1


def test_local_indices_rejects_a_bad_process_index():
  with pytest.raises(ValueError, match="process_index 2 not in"):
    hostdata.local_indices(4, process_index=2, process_count=2)


def test_single_process_gathers_are_the_identity():
  assert hostdata.allgather_objects({"a": 1}) == [{"a": 1}]
  assert hostdata.allgather_dict({(0, 1): "t"}) == {(0, 1): "t"}
  assert hostdata.sum_over_processes(3) == 3.0
  assert hostdata.gather_lists([1, 2], ["a"]) == ([1, 2], ["a"])


def test_global_batch_places_the_host_rows_on_the_sharding():
  import jax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  batch = {"x": np.arange(16 * 3, dtype=np.int32).reshape(16, 3)}
  out = hostdata.global_batch(batch, lambda v: NamedSharding(mesh, P("data")))
  np.testing.assert_array_equal(np.asarray(out["x"]), batch["x"])
  assert out["x"].sharding.spec == P("data")
  np.testing.assert_array_equal(hostdata.to_host(out["x"]), batch["x"])


def test_initialize_from_env_names_the_bad_variable(monkeypatch):
  from rstar_jax.distributed import init

  monkeypatch.setenv(init.ENV_NUM_PROCESSES, "2")
  monkeypatch.setenv(init.ENV_COORDINATOR, "127.0.0.1:1")
  monkeypatch.setenv(init.ENV_PROCESS_ID, "5")
  with pytest.raises(ValueError, match="RSTAR_PROCESS_ID: expected an integer in"):
    init.initialize_from_env()
  monkeypatch.setenv(init.ENV_NUM_PROCESSES, "1")
  assert init.initialize_from_env() is False


def test_local_cluster_prefixes_output_and_passes_the_environment():
  out = subprocess.run(
    [
      "bash",
      CLUSTER,
      "2",
      "3",
      "--",
      "bash",
      "-c",
      'echo "id=$RSTAR_PROCESS_ID n=$RSTAR_NUM_PROCESSES c=${RSTAR_COORDINATOR%:*} $XLA_FLAGS"',
    ],
    # A harness's device count, which the script replaces (tests/conftest.py may add flags).
    env=dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8"),
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert out.returncode == 0, out.stderr
  lines = sorted(out.stdout.splitlines())
  assert lines == [
    f"[{i}] id={i} n=2 c=127.0.0.1 --xla_force_host_platform_device_count=3" for i in range(2)
  ]


def test_local_cluster_ends_the_others_when_one_fails(tmp_path):
  marker = tmp_path / "pids"
  t0 = time.monotonic()
  out = subprocess.run(
    [
      "bash",
      CLUSTER,
      "3",
      "1",
      "--",
      "bash",
      "-c",
      f'echo $$ >> {marker}; if [ "$RSTAR_PROCESS_ID" = 1 ]; then sleep 0.5; exit 7; fi; sleep 300',
    ],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == 7
  assert time.monotonic() - t0 < 60
  assert "process 1 exited with status 7" in out.stderr
  for pid in map(int, marker.read_text().split()):
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)


def test_local_cluster_usage_error():
  out = subprocess.run(
    ["bash", CLUSTER, "2", "x", "--", "true"], capture_output=True, text=True, timeout=30
  )
  assert out.returncode == 2 and "DEVICES_PER_PROCESS" in out.stderr


def test_compare_metrics_ignores_timings_and_flags_differences(tmp_path):
  sys.path.insert(0, os.path.join(REPO, "scripts"))
  try:
    import compare_metrics
  finally:
    sys.path.pop(0)
  a = {1: {"step": 1, "loss": 1.0, "time_step_s": 3.0}}
  assert (
    compare_metrics.compare(a, {1: {"step": 1, "loss": 1.0, "time_step_s": 9.0}}, 1e-4, 1e-6) == []
  )
  assert compare_metrics.compare(
    a, {1: {"step": 1, "loss": 1.1, "time_step_s": 3.0}}, 1e-4, 1e-6
  ) == ["step 1 loss: 1.0 vs 1.1"]
