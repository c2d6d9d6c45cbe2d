"""Finding the pool's cgroup directories (cgroups.find) from mountinfo and /proc/self/cgroup,
for v1, v2 and machines without either: parsed from files, so every layout is checked here
whatever this machine mounts."""

import os

import pytest

from rstar_jax.tools import cgroups

_V1_MOUNTS = """31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
_V1_OWN = "8:pids:/\n4:memory:/jobs/abc\n0::/\n"


def _write(tmp_path, mounts, own):
  (tmp_path / "mountinfo").write_text(mounts)
  (tmp_path / "cgroup").write_text(own)
  return str(tmp_path / "mountinfo"), str(tmp_path / "cgroup")


def test_v1_directories_follow_each_controllers_own_path(tmp_path, monkeypatch):
  mi, cg = _write(tmp_path, _V1_MOUNTS, _V1_OWN)
  monkeypatch.setattr(os.path, "isdir", lambda p: True)
  # The unified mount offers no controllers here (its cgroup.controllers is unreadable).
  assert cgroups.find(mi, cg) == (
    1,
    {"memory": "/sys/fs/cgroup/memory/jobs/abc", "pids": "/sys/fs/cgroup/pids"},
  )


def test_v2_is_preferred_when_it_offers_both_controllers(tmp_path):
  root = tmp_path / "cg2"
  (root / "job").mkdir(parents=True)
  (root / "job" / "cgroup.controllers").write_text("cpu io memory pids\n")
  mounts = f"41 31 0:38 / {root} rw,relatime - cgroup2 cgroup2 rw\n"
  mi, cg = _write(tmp_path, mounts, "0::/job\n")
  assert cgroups.find(mi, cg) == (2, {"unified": f"{root}/job"})


def test_a_mount_whose_root_is_our_cgroup_maps_to_its_top(tmp_path):
  """Inside a container the hierarchy is mounted from our own cgroup down."""
  root = tmp_path / "cg2"
  root.mkdir()
  (root / "cgroup.controllers").write_text("memory pids\n")
  mounts = f"41 31 0:38 /kubepods/pod1 {root} rw - cgroup2 cgroup2 rw\n"
  mi, cg = _write(tmp_path, mounts, "0::/kubepods/pod1\n")
  assert cgroups.find(mi, cg) == (2, {"unified": str(root)})


def test_missing_controllers_say_which(tmp_path):
  mounts = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
  mi, cg = _write(tmp_path, mounts, "4:memory:/\n")
  version, why = cgroups.find(mi, cg)
  assert version == 0 and "pids" in why, why
  assert cgroups.find(str(tmp_path / "absent"), cg)[0] == 0


def test_an_empty_directory_left_by_a_dead_process_with_our_pid_is_replaced(tmp_path):
  """A pool's directory is named by its pid: one a killed process left behind made every later
  process given that pid start without cgroups ("File exists"). An empty one is removed; one
  still holding something (here a file: a cgroup with tasks cannot be removed either) is not."""
  own = {c: str(tmp_path / c) for c in cgroups.CONTROLLERS}
  for c in cgroups.CONTROLLERS:
    os.makedirs(os.path.join(own[c], f"rstar_code_pool_{os.getpid()}_stale", "t0_1", "c1"))
  pc = cgroups.PoolCgroups(1, own, "stale")
  assert all(os.listdir(d) == [] for d in pc.base.values())
  busy = os.path.join(own["pids"], f"rstar_code_pool_{os.getpid()}_busy")
  os.makedirs(busy)
  open(os.path.join(busy, "tasks"), "w").close()
  with pytest.raises(FileExistsError):
    cgroups.PoolCgroups(1, own, "busy")
  assert not os.path.exists(os.path.join(own["memory"], f"rstar_code_pool_{os.getpid()}_busy"))


def test_trees_of_dead_pools_are_swept_at_start(tmp_path):
  """A host killed before its close leaves `rstar_code_pool_<pid>_<tag>` behind in every
  controller (17 such pids trees piled up here in one session of killed test pools). A new pool
  removes those whose owner is dead and which are empty; a live owner's tree, a tree with
  processes and other directories stay."""
  import subprocess
  import sys

  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()  # its pid is free (reuse within this test is not expected)
  own = {c: str(tmp_path / c) for c in cgroups.CONTROLLERS}
  for c in cgroups.CONTROLLERS:
    os.makedirs(os.path.join(own[c], f"rstar_code_pool_{dead.pid}_0", "t0_1"))
    os.makedirs(os.path.join(own[c], f"rstar_code_pool_{os.getppid()}_0", "t0_1"))  # alive
    os.makedirs(os.path.join(own[c], "someone_else_1_2"))
  busy = os.path.join(own["pids"], f"rstar_code_pool_{dead.pid}_1", "t0_1")
  os.makedirs(busy)
  with open(os.path.join(busy, "cgroup.procs"), "w") as f:
    f.write(f"{os.getpid()}\n")  # a process still in it
  cgroups.PoolCgroups(1, own, "new")
  for c in cgroups.CONTROLLERS:
    left = sorted(os.listdir(own[c]))
    assert f"rstar_code_pool_{dead.pid}_0" not in left, c
    assert {f"rstar_code_pool_{os.getppid()}_0", "someone_else_1_2"} <= set(left), c
    assert f"rstar_code_pool_{os.getpid()}_new" in left, c
  assert os.path.isdir(busy)
