"""benchmarks/chaos.py's driver logic without its runs (issue 38 item 4: what only the long tier
reached): the per-kind summary, the order of runs and kill plans per mode, the report and exit
code, the learner-kill thread against a stand-in "learner" process, and the supervised
launcher run's bookkeeping with the launcher stood in for. The RL runs themselves (`run_once`,
the fleet's processes, a real `launchers.train`) are the long tier's."""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load():
  spec = importlib.util.spec_from_file_location(
    "chaos_bench_logic", os.path.join(REPO, "benchmarks", "chaos.py")
  )
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


chaos = _load()


def _result(consumed, group_sizes, *, params, rollout_s=4.0, kills=(), statuses=None, steps=2):
  return {
    "steps": steps,
    "wall_s": 10.0,
    "consumed": list(consumed),
    "group_sizes": list(group_sizes),
    "tool_statuses": statuses or {"ok": len(consumed)},
    "params": params,
    "kills": list(kills),
    "engine": {"failovers": 1, "regenerated_turns": 2, "rejoins": 1},
    "tool_client": {"node_failures": 0},
    "rollout_s": rollout_s,
  }


def test_summarize_counts_lost_twice_failed_calls_and_the_weights_criterion():
  args = argparse.Namespace(steps=2, group=2)
  w = [np.ones(3, np.float32)]
  ref = _result("abcd", [2, 2], params=w)
  kills = [{"step": 1, "back_after_s": 1.5}, {"step": 2}]  # the second never came back
  bad = _result(
    "aabc",  # "a" twice, "d" never, the second group one sample short
    [2, 1],
    params=[w[0] + np.float32(0.5)],
    rollout_s=6.0,
    kills=kills,
    statuses={"ok": 3, "timeout": 1},
  )
  s = chaos.summarize("sync", args, ref, bad, None)
  assert s["trajectories_lost"] == 2  # one short in a group + "d" not trained (sync counts it)
  assert s["trajectories_trained_twice"] == 1 and s["tool_calls_failed"] == 1
  assert s["kills"] == 2 and s["restarts"] == 1 and s["rollout_s_per_failure"] == 1.0
  assert not s["trained_set_equals_reference"]
  assert not s["final_weights_match"] and s["weights_criterion"] == "equal bytes"
  same = chaos.summarize("sync", args, ref, _result("badc", [2, 2], params=list(w)), None)
  assert same["trajectories_lost"] == 0 and same["final_weights_match"]
  assert same["rollout_s_per_failure"] is None  # no kill: no per-failure cost
  # async: a trajectory the reference trained but this run did not is not "lost" (which groups
  # a step takes may differ), only samples missing from trained groups; weights within 2x the
  # undisturbed spread.
  a = chaos.summarize("async", args, ref, bad, {"rel_l2": 0.3})
  assert a["trajectories_lost"] == 1 and a["final_weights_match"]  # rel_l2 0.5 <= 0.6
  assert not chaos.summarize("async", args, ref, bad, {"rel_l2": 0.1})["final_weights_match"]


def _fake_fleet(monkeypatch, calls):
  fleet = {"rollout_server": ["s0", "s1", "s2"], "tool_node": ["t0", "t1"]}
  monkeypatch.setattr(chaos, "start_fleet", lambda args, work: fleet)
  monkeypatch.setattr(chaos, "stop_fleet", lambda f: calls.append(("stop", f is fleet)))
  return fleet


def test_bench_mode_runs_the_references_then_each_kind_with_its_seeded_plan(tmp_path, monkeypatch):
  calls = []
  _fake_fleet(monkeypatch, calls)
  w = [np.arange(4, dtype=np.float32)]

  def run_once(mode, args, fleet, work, kind=None, plan=None):
    calls.append(("run", os.path.basename(work), kind, plan))
    return _result("abcd", [2, 2], params=[w[0] + (0.01 if work.endswith("ref2") else 0.0)])

  def bench_learner(mode, args, fleet, work, seed):
    calls.append(("learner", seed))
    return {
      "steps_completed": 3,
      "steps_expected": 3,
      "kills": 1,
      "restarts": 1,
      "trajectories_lost": 0,
      "trajectories_trained_twice": 0,
      "final_weights_match": True,
      "final_state": {},
    }

  monkeypatch.setattr(chaos, "run_once", run_once)
  monkeypatch.setattr(chaos, "bench_learner", bench_learner)
  args = argparse.Namespace(seed=5, kills=2, steps=2, group=2, tmp=str(tmp_path))
  out = chaos.bench_mode("async", args, ["rollout_server", "learner", "tool_node"])
  window = 0.5 * 4.0 / 2  # half the reference's mean rollout phase per step
  assert calls == [
    ("run", "ref", None, None),
    ("run", "ref2", None, None),
    ("run", "rollout_server", "rollout_server", chaos.kill_schedule(6, 2, 2, 3, window)),
    ("learner", 15),  # seed + 10 x its index among the kinds
    ("run", "tool_node", "tool_node", chaos.kill_schedule(26, 2, 2, 2, window)),
    ("stop", True),
  ]
  assert out["undisturbed_spread"]["rel_l2"] > 0 and out["reference"]["trajectories_trained"] == 4
  assert out["tool_node"]["final_weights_match"]  # equal to the reference: within the spread
  assert out["learner"]["restarts"] == 1
  # sync: one reference; learner kills alone need none; the fleet is stopped on a failure too.
  calls.clear()
  chaos.bench_mode("sync", args, ["learner"])
  assert calls == [("learner", 5), ("stop", True)]

  def boom(*a, **kw):
    raise RuntimeError("run failed")

  calls.clear()
  monkeypatch.setattr(chaos, "run_once", boom)
  with pytest.raises(RuntimeError, match="run failed"):
    chaos.bench_mode("sync", args, ["tool_node"])
  assert calls == [("stop", True)]


def test_main_writes_the_report_and_exits_1_when_a_trajectory_is_lost(tmp_path, monkeypatch):
  seen = []

  def bench_mode(mode, args, kinds):
    seen.append((mode, kinds, os.path.isdir(args.tmp)))
    lost = 1 if mode == "async" else 0
    return {
      k: {"trajectories_lost": lost, "trajectories_trained_twice": 0, "steps_completed": 2,
          "steps_expected": 2}
      for k in kinds
    }  # fmt: skip

  monkeypatch.setattr(chaos, "bench_mode", bench_mode)
  out = tmp_path / "r.json"
  assert chaos.main(["--modes=sync", "--kinds=tool_node", "--steps=2", f"--out={out}"]) == 0
  report = json.loads(out.read_text())
  assert seen == [("sync", ["tool_node"], True)]
  assert report["kinds"] == ["tool_node"] and report["config"]["steps"] == 2
  assert report["learner_kills"]["injected"] is False and report["tool_node_kills"]["available"]
  assert report["modes"]["sync"]["tool_node"]["trajectories_lost"] == 0
  assert chaos.main(["--modes=sync,async", "--kinds=learner", f"--out={out}"]) == 1
  assert json.loads(out.read_text())["learner_kills"]["injected"] is True


def test_main_rejects_an_unknown_kind_in_one_line(capsys):
  with pytest.raises(SystemExit) as e:
    chaos.main(["--kinds=tool_node,gpu"])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert "--kinds: unknown ['gpu']" in err and "rollout_server" in err


def _write_supervisor(wd, state, attempts):
  tmp = os.path.join(wd, "supervisor.json.tmp")
  with open(tmp, "w") as f:
    json.dump({"state": state, "attempts": attempts}, f)
  os.replace(tmp, os.path.join(wd, "supervisor.json"))  # the thread never reads half a file


def _wait(pred, timeout=30.0):
  end = time.monotonic() + timeout
  while not pred():
    assert time.monotonic() < end, "timed out"
    time.sleep(0.02)


def test_learner_chaos_kills_the_running_attempts_learner_in_its_step(tmp_path):
  """The kill waits for the attempt to log step - 1, kills its pid with SIGKILL, then records
  when the supervisor's next attempt started and where it resumed."""
  wd = str(tmp_path)
  learner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    _write_supervisor(wd, "running", [{"attempt": 0, "pids": [learner.pid]}])
    with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"step": 1, "restarts": 0}) + "\n")
    monkey = chaos.LearnerChaos(wd, [(3, 0.0, 0)])
    monkey.start()
    time.sleep(0.3)
    assert learner.poll() is None  # step 2 not logged yet: step 3 has not begun
    with open(os.path.join(wd, "metrics.jsonl"), "a") as f:
      f.write(json.dumps({"step": 2, "restarts": 0}) + '\n{"step": 3, "rest')  # a cut last line
    assert learner.wait(30) == -9
    time.sleep(0.2)
    assert monkey.is_alive()  # waiting for the supervisor's next attempt
    _write_supervisor(
      wd,
      "running",
      [
        {"attempt": 0, "pids": [learner.pid]},
        {"attempt": 1, "pids": [1], "resumed_from_step": 2},
      ],
    )
    monkey.join(30)
    assert not monkey.is_alive()
    (ev,) = monkey.events
    assert ev["pid"] == learner.pid and ev["step"] == 3 and ev["last_logged_step"] == 2
    assert ev["resumed_from_step"] == 2 and ev["restarted_after_s"] >= 0.2
  finally:
    learner.kill()
    learner.wait()


def test_learner_chaos_gives_up_when_the_run_ends_first(tmp_path):
  _write_supervisor(str(tmp_path), "done", [{"attempt": 0, "pids": [2**22 + 1]}])
  monkey = chaos.LearnerChaos(str(tmp_path), [(2, 0.0, 0)])
  monkey.start()
  monkey.join(10)
  assert not monkey.is_alive() and monkey.events == []


class _FakeLauncher:
  """`subprocess.Popen` of `launchers.train`: writes what a supervised run leaves in its workdir
  (two attempts: the first logged steps 1-2 and died, the second resumed from step 1)."""

  seen: list = []

  def __init__(self, cmd, cwd, env, stdout, stderr):
    type(self).seen.append((cmd, env))
    wd = next(a.split("=", 1)[1] for a in cmd if a.startswith("--workdir="))
    self.rc = int(env.get("FAKE_RC", "0"))
    os.makedirs(wd, exist_ok=True)
    stdout.write(b"line 1\nTraceback: the learner failed\n")
    stdout.flush()
    rows = [
      {"step": 1, "restarts": 0, "time_rollout_s": 5.0, "time_step_s": 9.0},
      {"step": 2, "restarts": 0, "time_rollout_s": 5.0, "time_step_s": 3.0},
      {"step": 2, "restarts": 1, "time_rollout_s": 1.5, "time_step_s": 2.0},
      {"step": 3, "restarts": 1, "time_rollout_s": 2.5, "time_step_s": 2.5},
    ]
    with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
      f.write("".join(json.dumps(r) + "\n" for r in rows))
    with open(os.path.join(wd, "supervisor.json"), "w") as f:
      json.dump({"state": "done", "restarts": 1, "attempts": [{"attempt": 1, "pids": [1]}]}, f)
    ledger = [
      {"step": s, "groups": [[s, s, 10 * s]], "trained": [[0, 0], [0, 1]]} for s in (1, 2, 3)
    ]
    with open(os.path.join(wd, "trained.jsonl"), "w") as f:
      f.write("".join(json.dumps(r) + "\n" for r in ledger))

  def wait(self, timeout=None):
    return self.rc


def test_run_launcher_reads_back_the_supervised_run(tmp_path, monkeypatch):
  """The command (this file as the config, one restart more than the kills), the environment
  (the code pool's token never reaches the run), and the figures read back: the last attempt's
  rollout time, the steps each kill made the run redo, the ledger, the final state."""
  monkeypatch.setattr(subprocess, "Popen", _FakeLauncher)
  monkeypatch.setattr(chaos, "_final_state", lambda wd: (3, [np.zeros(2)]))
  monkeypatch.setenv("RSTAR_CODE_POOL_TOKEN", "secret")

  class NoKills(chaos.LearnerChaos):  # the plan's kill thread, with a kill already recorded
    def run(self):
      self.events.append({"last_logged_step": 2, "resumed_from_step": 0})

  monkeypatch.setattr(chaos, "LearnerChaos", NoKills)
  fleet = {
    "rollout_server": [argparse.Namespace(url="http://127.0.0.1:9")],
    "tool_node": [argparse.Namespace(url="http://127.0.0.1:8")],
    "tokenizer_dir": "/tok",
    "problems_path": "/p.jsonl",
  }
  args = argparse.Namespace(seed=1, steps=3, learner_timeout_s=60, _private=object())
  _FakeLauncher.seen = []
  r = chaos.run_launcher("sync", args, fleet, str(tmp_path / "w"), plan=[(2, 0.1, 0)])
  [(cmd, env)] = _FakeLauncher.seen
  assert cmd[1:3] == ["-m", "launchers.train"] and "--max_restarts=2" in cmd
  assert "RSTAR_CODE_POOL_TOKEN" not in env and env["PYTHONPATH"].startswith(chaos.ROOT)
  settings = json.loads((tmp_path / "w" / "settings.json").read_text())
  assert settings["urls"] == ["http://127.0.0.1:9"] and "_private" not in settings["args"]
  assert r["steps"] == 3 and r["restarts"] == 1 and r["supervisor_state"] == "done"
  assert r["rollout_s"] == 4.0  # the last attempt's rows only
  assert r["step_s"] == [9.0, 3.0, 2.0, 2.5] and r["rows"] == 4
  assert r["steps_redone"] == [1, 2]  # logged by the killed attempt after its checkpoint
  assert [row["step"] for row in r["ledger"]] == [1, 2, 3]
  monkeypatch.setenv("FAKE_RC", "3")
  with pytest.raises(RuntimeError, match="exited 3; log tail:") as e:
    chaos.run_launcher("sync", args, fleet, str(tmp_path / "w2"))
  assert str(e.value).endswith("Traceback: the learner failed\n")


def _ledger(groups_per_step, samples=2):
  return [
    {"step": s, "groups": [list(g) for g in gs], "trained": [[i, j] for i in range(len(gs))
     for j in range(samples)]}
    for s, gs in enumerate(groups_per_step, start=1)
  ]  # fmt: skip


def test_bench_learner_plans_kills_after_step_1_and_audits_the_ledgers(tmp_path, monkeypatch):
  ref_ledger = _ledger([[(0, 3, 30)], [(1, 4, 40)], [(2, 5, 50)]])
  calls = []

  def run_launcher(mode, args, fleet, work, plan=None):
    name = os.path.basename(work)
    calls.append((name, plan))
    ledger = ref_ledger
    if name == "learner_chaos":  # step 3 trained step 2's group again: lost one, twice one
      ledger = _ledger([[(0, 3, 30)], [(1, 4, 40)], [(2, 4, 40)]])
    return {
      "steps": 3,
      "wall_s": 20.0 if name == "learner_chaos" else 12.0,
      "arrays": [np.ones(2, np.float32)],
      "kills": [{"step": 2}] if plan else [],
      "restarts": 1 if plan else 0,
      "supervisor_state": "done",
      "steps_redone": [2] if plan else [],
      "step_s": [9.0, 2.0, 4.0],
      "ledger": ledger,
    }

  monkeypatch.setattr(chaos, "run_launcher", run_launcher)
  args = argparse.Namespace(steps=3, kills=1, group=2)
  out = chaos.bench_learner("async", args, {}, str(tmp_path), 7)
  (chaos_plan,) = [p for n, p in calls if n == "learner_chaos"]
  assert [n for n, _ in calls] == ["learner_ref", "learner_ref2", "learner_chaos"]
  # Steps 2.. only (step 1 holds the start and the compile), within 80% of a later step.
  window = 0.8 * 4.0
  assert chaos_plan == [(s + 1, d, i) for s, d, i in chaos.kill_schedule(7, 1, 2, 1, window)]
  assert all(2 <= s <= 3 and 0 <= d < window for s, d, _ in chaos_plan)
  assert out["undisturbed_spread"]["same_groups_per_step"]
  assert out["trajectories_lost"] == 2 and out["trajectories_trained_twice"] == 2
  assert out["steps_with_other_groups_than_reference"] == 1 and out["groups_taken_twice"] == 1
  assert out["wall_s_per_failure"] == 8.0 and out["final_weights_match"]
  assert out["steps_redone_after_a_kill"] == [2]
  sync = chaos.bench_learner("sync", args, {}, str(tmp_path), 7)
  assert "undisturbed_spread" not in sync and sync["weights_criterion"].startswith("equal bytes")


def test_step_groups_and_the_run_files_readers(tmp_path):
  assert chaos.step_groups(_ledger([[(0, 3, 30), (1, 4, 40)], [(2, 5, 50)]])) == [
    [(3, 30), (4, 40)],
    [(5, 50)],
  ]
  assert chaos._read_json(str(tmp_path / "none.json")) is None
  (tmp_path / "bad.json").write_text('{"state": "run')
  assert chaos._read_json(str(tmp_path / "bad.json")) is None
  assert chaos._metric_rows(str(tmp_path)) == []  # no metrics.jsonl yet
  (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "lo')
  assert chaos._metric_rows(str(tmp_path)) == [{"step": 1}]


class _Target:
  """A fleet process as the chaos thread sees it: ``busy`` yields its running requests per
  poll (-1: not reported), then the last value forever."""

  def __init__(self, port, busy):
    self.port, self.busy, self.up, self.starts, self.polls = port, list(busy), True, [], 0

  def running_requests(self):
    self.polls += 1
    return self.busy.pop(0) if len(self.busy) > 1 else self.busy[0]

  def alive(self):
    return self.up

  def kill9(self):
    self.up = False

  def start(self, port):
    self.starts.append(port)
    self.up = True

  def wait_ready(self):
    return f"http://127.0.0.1:{self.port}"


def _one_kill(targets, plan):
  started = {1: threading.Event()}
  started[1].set()
  monkey = chaos.Chaos(targets, plan, started, down_s=0.0)
  monkey.start()
  monkey.join(30)
  assert not monkey.is_alive()
  return monkey.events


def test_chaos_kills_the_first_target_with_a_request_running_else_the_scheduled_one():
  # Scheduled: target 0; target 1 is the first to report a running request (third poll).
  targets = [_Target(7000, [0]), _Target(7001, [0, 0, 2])]
  (ev,) = _one_kill(targets, [(1, 0.0, 0)])
  assert ev["target"] == 1 and ev["busy_requests"] == 2 and "back_after_s" in ev
  assert targets[1].starts == [7001] and targets[0].starts == []  # back on its own port
  # Tool nodes report nothing (-1): the scheduled one is killed at once, no busy count.
  targets = [_Target(7000, [-1]), _Target(7001, [-1])]
  (ev,) = _one_kill(targets, [(1, 0.0, 1)])
  assert ev["target"] == 1 and "busy_requests" not in ev and targets[1].starts == [7001]
  assert [t.polls for t in targets] == [1, 1]  # not waited on for a request to show
  # Only one up: the kill is skipped (one of each kind always stays up).
  targets[0].up = False
  assert _one_kill(targets, [(1, 0.0, 1)]) == []
