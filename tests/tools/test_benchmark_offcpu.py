"""The off-CPU table of `benchmarks/code_pool.py --offcpu`, from a hand-written `perf script`
excerpt: which sleeps count (the roots and what they fork), how long each lasted, and which
stacks are left out (the templates' idle epoll waits)."""

import importlib.util
import os
import sys


def _load_bench():
  """benchmarks/code_pool.py under a name of its own, with sys.path as it was (the script puts
  its folder first, whose module names must not shadow anything for the other tests)."""
  path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "code_pool.py")
  spec = importlib.util.spec_from_file_location("bench_code_pool", os.path.abspath(path))
  module = importlib.util.module_from_spec(spec)
  saved = list(sys.path)
  try:
    spec.loader.exec_module(module)
  finally:
    sys.path[:] = saved
  return module


bench = _load_bench()


def _switch(pid, t, state, next_pid, stack=()):
  head = (
    f"  python {pid} [000] {t:.6f}:       sched:sched_switch: prev_comm=python prev_pid={pid} "
    f"prev_prio=120 prev_state={state} ==> next_comm=x next_pid={next_pid} next_prio=120"
  )
  frames = [f"\tffffffff8100000{i} {name}+0x1 ([kernel.kallsyms])" for i, name in enumerate(stack)]
  return "\n".join([head, *frames, ""])


def test_sleeps_of_the_roots_and_their_children_are_summed_per_stack():
  join = ("__schedule", "schedule", "__mutex_lock.constprop.0", "cgroup_kn_lock_live")
  idle = ("__schedule", "schedule_hrtimeout_range_clock", "do_epoll_wait")
  text = "\n".join(
    [
      "  python 10 [000] 1.000000: sched:sched_process_fork: comm=python pid=10 "
      "child_comm=python child_pid=11\n",
      _switch(11, 1.001, "D", 0, join),  # the call (forked by a root) waits 3 ms
      _switch(0, 1.004, "R", 11),
      _switch(11, 1.010, "D", 0, join),  # and again, 1 ms
      _switch(0, 1.011, "R", 11),
      _switch(10, 1.012, "S", 0, idle),  # the template's idle wait: left out
      _switch(0, 1.020, "R", 10),
      _switch(99, 1.013, "D", 0, join),  # not ours
      _switch(0, 1.030, "R", 99),
      _switch(11, 1.040, "R", 0, join),  # preempted, not a sleep
      _switch(0, 1.050, "R", 11),
    ]
  )
  table = bench._offcpu_table(text, roots=[10])
  assert list(table) == ["D __mutex_lock.constprop.0 < cgroup_kn_lock_live"]
  ms, sleeps = table["D __mutex_lock.constprop.0 < cgroup_kn_lock_live"]
  assert sleeps == 2 and abs(ms - 4.0) < 1e-6
