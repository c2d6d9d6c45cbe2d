"""Host side of the code pool's memory + pids cgroups (issue 40, class 1).

The pool makes one directory per template under its own cgroup (v2 where the unified hierarchy
has the memory and pids controllers, v1 otherwise) and passes it to the template as a directory
fd; the template makes a child cgroup per call or session there (`sandbox_template.CgroupSlots`)
and each call's process moves itself in before anything of the call's runs. So the kernel's own
memory accounting, kernel memory included (pipe buffers, page tables, vmsplice'd and secret
pages, its tmpfs and output memfds), bounds a call, and the OOM counters say when it hit the
bound. Where no writable hierarchy has both controllers the pool runs without (RLIMIT_AS only)
and says so (`CodePool.memory_bound`).
"""

from __future__ import annotations

import os
import signal
import time

CONTROLLERS = ("memory", "pids")


def _own_cgroups(cgroup_file: str) -> dict[str, str]:
  """{controller or "": this process's cgroup path} from /proc/self/cgroup."""
  out = {}
  with open(cgroup_file) as f:
    for line in f:
      parts = line.rstrip("\n").split(":", 2)
      if len(parts) != 3:
        continue
      _, ctrls, path = parts
      for c in ctrls.split(",") if ctrls else [""]:
        out[c] = path
  return out


def _mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
  """(fs type, mount point, root within the fs, super options) of every cgroup mount."""
  out = []
  with open(mountinfo) as f:
    for line in f:
      left, _, right = line.partition(" - ")
      fields, rf = left.split(), right.split()
      if len(rf) >= 3 and rf[0] in ("cgroup", "cgroup2"):
        out.append((rf[0], fields[4], fields[3], set(rf[2].split(","))))
  return out


def _join(mount: str, root: str, path: str) -> str | None:
  """The directory of cgroup `path` under a mount whose root in the hierarchy is `root`."""
  if root != "/" and not (path == root or path.startswith(root.rstrip("/") + "/")):
    return None  # our cgroup lies outside what this mount shows
  rel = path[len(root) :] if root != "/" else path
  return os.path.normpath(os.path.join(mount, rel.lstrip("/")))


def find(mountinfo: str = "/proc/self/mountinfo", cgroup_file: str = "/proc/self/cgroup"):
  """(version, {controller: directory of this process's cgroup}) or (0, why not).

  v2 when the unified hierarchy offers both controllers to our cgroup, else v1 when both are
  mounted as v1 hierarchies. v2's single directory is keyed "unified"."""
  try:
    own, mounts = _own_cgroups(cgroup_file), _mounts(mountinfo)
  except OSError as e:
    return 0, f"cannot read {e.filename}: {e.strerror}"
  for fstype, mnt, root, _ in mounts:
    if fstype == "cgroup2" and "" in own:
      d = _join(mnt, root, own[""])
      try:
        with open(os.path.join(d or "", "cgroup.controllers")) as f:
          have = set(f.read().split())
      except OSError:
        continue
      if d and have.issuperset(CONTROLLERS):
        return 2, {"unified": d}
  dirs = {}
  for c in CONTROLLERS:
    for fstype, mnt, root, opts in mounts:
      if fstype == "cgroup" and c in opts and c in own:
        d = _join(mnt, root, own[c])
        if d and os.path.isdir(d):
          dirs[c] = d
          break
  missing = [c for c in CONTROLLERS if c not in dirs]
  if missing:
    return 0, f"no cgroup hierarchy with the {'/'.join(missing)} controller(s) is mounted"
  return 1, dirs


class PoolCgroups:
  """The pool's directory per controller, `<own cgroup>/rstar_code_pool_<pid>_<tag>`, with one
  subdirectory per template start. Raises OSError when the hierarchy is not writable."""

  def __init__(self, version: int, own_dirs: dict[str, str], tag: str):
    self.version = version
    self.base = {
      c: os.path.join(d, f"rstar_code_pool_{os.getpid()}_{tag}") for c, d in own_dirs.items()
    }
    for d in own_dirs.values():
      sweep_dead_owners(d)
    made = []
    try:
      for c, d in self.base.items():
        if version == 2:
          _enable_controllers(own_dirs[c])
        # One left by a process that had our pid and died before its close (killed): removed
        # when empty, else this start fails as before. Kept, it made every later process
        # given that pid run without cgroups (a lower level).
        remove_tree(d)
        os.mkdir(d, 0o755)
        made.append(d)
        if version == 2:
          _enable_controllers(d)
    except OSError:
      for d in made:
        remove_tree(d)
      raise

  def template_dirs(self, name: str, owner: int | None = None) -> dict[str, str]:
    """Fresh directories for one template start (a restarted template gets new ones). With
    `owner`, they and their files are given to that host uid: a template in its own user
    namespace (whose root is `owner`) holds no capability over files of an unmapped owner."""
    out = {}
    for c, base in self.base.items():
      d = os.path.join(base, name)
      remove_tree(d)
      os.mkdir(d, 0o755)
      if self.version == 2:
        _enable_controllers(d)
      if owner is not None:
        os.chown(d, owner, owner)
        for f in os.listdir(d):
          if os.path.isfile(os.path.join(d, f)):
            os.chown(os.path.join(d, f), owner, owner)
      out[c] = d
    return out

  def kill_and_remove(self, dirs: dict[str, str], wait_s: float = 5.0) -> None:
    """SIGKILLs every process left in a template's cgroups, then removes them (an emptied
    cgroup can be removed once its last process is reaped; retried for up to `wait_s`)."""
    deadline = time.monotonic() + wait_s
    while True:
      for d in dirs.values():
        for pid in tree_pids(d):
          try:
            os.kill(pid, signal.SIGKILL)
          except OSError:
            pass
      if all(remove_tree(d) for d in dirs.values()) or time.monotonic() > deadline:
        return
      time.sleep(0.05)

  def close(self) -> None:
    for d in self.base.values():
      self.kill_and_remove({"": d}, wait_s=2.0)


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # alive, someone else's
    return True
  return True


def sweep_dead_owners(parent: str) -> list[str]:
  """Removes the empty pool directories under ``parent`` whose owner pid is dead (a host killed
  before its close leaves its tree behind; without this, each killed host left one per
  controller for good). Trees still holding processes stay: what runs there is not ours to
  kill. Returns the directories removed."""
  gone = []
  try:
    names = os.listdir(parent)
  except OSError:
    return gone
  for name in names:
    parts = name.split("_")
    if not name.startswith("rstar_code_pool_") or len(parts) < 5 or not parts[3].isdigit():
      continue
    pid = int(parts[3])
    d = os.path.join(parent, name)
    if pid != os.getpid() and not _pid_alive(pid) and not tree_pids(d) and remove_tree(d):
      gone.append(d)
  return gone


def _enable_controllers(d: str) -> None:
  with open(os.path.join(d, "cgroup.subtree_control"), "w") as f:
    f.write(" ".join(f"+{c}" for c in CONTROLLERS))


def tree_pids(d: str) -> list[int]:
  """Host pids of every process in cgroup directory `d` and below."""
  out = []
  for root, _, files in os.walk(d):
    if "cgroup.procs" in files:
      try:
        with open(os.path.join(root, "cgroup.procs")) as f:
          out += [int(p) for p in f.read().split()]
      except (OSError, ValueError):
        pass
  return out


def remove_tree(d: str) -> bool:
  """rmdir of a cgroup directory and its child cgroups, deepest first; True when gone."""
  if not os.path.isdir(d):
    return True
  for root, _, _ in sorted(os.walk(d), key=lambda w: -w[0].count("/")):
    try:
      os.rmdir(root)
    except OSError:
      pass
  return not os.path.isdir(d)
