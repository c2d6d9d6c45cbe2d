"""The supervisor (`--max_restarts`, issue 41 item 4) with stand-in learners: small Python
scripts that checkpoint like a launcher (``<workdir>/ckpt/<step>`` folders) and die the way a
learner dies (SIGKILL from outside, a peer lost in a multi-process run). Fast; the real
launchers under the supervisor are in test_supervisor_runs.py (slow)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rstar_jax.pipelines import supervisor
from rstar_jax.pipelines.supervisor import Supervisor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A learner: resumes after the last complete checkpoint, "trains" STEPS steps (one checkpoint
# each), logs what it saw. KILL_AT=s: on its first start (RSTAR_RESTARTS=0) process KILL_PROC
# SIGKILLs itself at step s. HANG=1: a process that is not the one killed waits forever after
# its first step, as a JAX process whose peer died waits in a collective. EXIT=n: exits n.
LEARNER = textwrap.dedent(
  """
  import json, os, signal, sys, time
  workdir = sys.argv[1]
  ck = os.path.join(workdir, "ckpt")
  os.makedirs(ck, exist_ok=True)
  env = os.environ
  proc = int(env.get("RSTAR_PROCESS_ID", "0"))
  attempt = int(env["RSTAR_RESTARTS"])
  with open(os.path.join(workdir, "log.jsonl"), "a") as f:
    f.write(json.dumps({"proc": proc, "attempt": attempt, "pid": os.getpid(),
                        "argv": sys.argv[1:], "coord": env.get("RSTAR_COORDINATOR"),
                        "supervised": env.get("RSTAR_SUPERVISED")}) + "\\n")
  if env.get("EXIT"):
    sys.exit(int(env["EXIT"]))
  steps = [int(n) for n in os.listdir(ck) if n.isdigit()]
  start = max(steps, default=0)
  for step in range(start + 1, int(env.get("STEPS", "3")) + 1):
    if env.get("KILL_AT") == str(step) and attempt == 0 and proc == int(env.get("KILL_PROC", "0")):
      os.kill(os.getpid(), signal.SIGKILL)
    if env.get("HANG") and attempt == 0 and proc != int(env.get("KILL_PROC", "0")):
      time.sleep(3600)
    if proc == 0:
      os.makedirs(os.path.join(ck, f"{step}.orbax-checkpoint-tmp-1"))
      os.rename(os.path.join(ck, f"{step}.orbax-checkpoint-tmp-1"), os.path.join(ck, str(step)))
  """
)


@pytest.fixture
def learner(tmp_path, monkeypatch):
  """(argv, workdir): the stand-in learner's command; environment knobs via monkeypatch."""
  script = tmp_path / "learner.py"
  script.write_text(LEARNER)
  workdir = tmp_path / "run"
  for k in ("RSTAR_COORDINATOR", "RSTAR_NUM_PROCESSES", "RSTAR_PROCESS_ID", "RSTAR_RESTARTS"):
    monkeypatch.delenv(k, raising=False)
  return [sys.executable, str(script), str(workdir)], str(workdir)


def _log(workdir):
  with open(os.path.join(workdir, "log.jsonl")) as f:
    return [json.loads(line) for line in f]


def _state(workdir):
  with open(os.path.join(workdir, supervisor.STATE_FILE)) as f:
    return json.load(f)


def _supervise(argv, workdir, **kw):
  said = []
  sup = Supervisor(argv, workdir, grace_s=5.0, poll_s=0.05, say=said.append, **kw)
  return sup.run(), said


def test_a_killed_learner_restarts_from_its_last_checkpoint(learner, monkeypatch):
  argv, workdir = learner
  monkeypatch.setenv("STEPS", "4")
  monkeypatch.setenv("KILL_AT", "3")
  rc, said = _supervise(argv, workdir, max_restarts=2)
  assert rc == 0
  assert said == [
    "learner process 0 (pid %d) was killed by SIGKILL; restart 1 of 2 from the checkpoint of "
    "step 2" % _log(workdir)[0]["pid"]
  ]
  assert [(r["attempt"], r["supervised"]) for r in _log(workdir)] == [(0, "1"), (1, "1")]
  st = _state(workdir)
  assert st["state"] == "done" and st["restarts"] == 1
  assert [a["resumed_from_step"] for a in st["attempts"]] == [None, 2]
  assert st["attempts"][0]["exits"][0]["signal"] == "SIGKILL"
  assert st["attempts"][1]["exits"][0]["returncode"] == 0
  assert sorted(os.listdir(os.path.join(workdir, "ckpt"))) == ["1", "2", "3", "4"]


def test_a_kill_from_outside_restarts_too(learner, monkeypatch):
  """What a chaos tool does: read the running attempt's pids from supervisor.json, kill -9."""
  argv, workdir = learner
  monkeypatch.setenv("STEPS", "2")
  monkeypatch.setenv("HANG", "1")
  monkeypatch.setenv("KILL_PROC", "1")  # process 0 is "not the killed one": it hangs
  out = {}

  def kill_when_running():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
      try:
        st = _state(workdir)
      except (OSError, ValueError):
        st = None
      if st and st["state"] == "running" and os.path.exists(os.path.join(workdir, "log.jsonl")):
        out["pid"] = st["attempts"][-1]["pids"][0]
        os.kill(out["pid"], signal.SIGKILL)
        return
      time.sleep(0.05)

  import threading

  t = threading.Thread(target=kill_when_running)
  t.start()
  rc, said = _supervise(argv, workdir, max_restarts=1)
  t.join()
  assert rc == 0 and len(said) == 1
  assert said[0].startswith(f"learner process 0 (pid {out['pid']}) was killed by SIGKILL")
  assert _state(workdir)["restarts"] == 1


def test_a_lost_process_of_two_restarts_both(learner, monkeypatch):
  """Process 1 dies; process 0 waits forever (a collective with a dead peer): the supervisor
  ends process 0 and starts both again, on a fresh coordinator port."""
  argv, workdir = learner
  monkeypatch.setenv("STEPS", "2")
  monkeypatch.setenv("KILL_AT", "1")
  monkeypatch.setenv("KILL_PROC", "1")
  monkeypatch.setenv("HANG", "1")
  rc, said = _supervise(argv, workdir, max_restarts=1, num_processes=2)
  assert rc == 0
  assert len(said) == 1 and said[0].startswith("learner process 1 (pid")
  assert said[0].endswith("restart 1 of 1 from the start (no checkpoint), all 2 processes")
  log = _log(workdir)
  assert sorted((r["attempt"], r["proc"]) for r in log) == [(0, 0), (0, 1), (1, 0), (1, 1)]
  coords = {r["attempt"]: r["coord"] for r in log}
  assert coords[0].startswith("127.0.0.1:") and coords[1].startswith("127.0.0.1:")
  assert len({r["coord"] for r in log if r["attempt"] == 0}) == 1
  first = _state(workdir)["attempts"][0]
  assert len(first["pids"]) == 2
  ended = {e["process"]: e for e in first["exits"]}
  assert ended[1]["signal"] == "SIGKILL" and ended[0]["signal"] == "SIGTERM"  # ended by us


def test_no_restart_left_is_one_line_and_a_failure(learner, monkeypatch):
  argv, workdir = learner
  monkeypatch.setenv("STEPS", "3")
  monkeypatch.setenv("KILL_AT", "2")
  rc, said = _supervise(argv, workdir, max_restarts=0)
  assert rc == 128 + signal.SIGKILL
  pid = _log(workdir)[0]["pid"]
  ck = os.path.join(os.path.abspath(workdir), "ckpt", "1")
  assert said == [
    f"learner process 0 (pid {pid}) was killed by SIGKILL; no restart left (0 of "
    f"--max_restarts=0 used); the last checkpoint is step 1 ({ck}): rerun the same command to "
    "resume"
  ]
  assert _state(workdir)["state"] == "failed"

  monkeypatch.setenv("EXIT", "1")
  rc, said = _supervise(argv, workdir + "2", max_restarts=2)
  assert rc == 1 and len(said) == 3
  assert said[-1].startswith("learner process 0 (pid")
  assert "exited with status 1; no restart left (2 of --max_restarts=2 used)" in said[-1]
  assert said[-1].endswith("there is no checkpoint yet: rerun the same command to resume")
  assert _state(workdir + "2")["restarts"] == 2


def test_a_user_error_or_ctrl_c_is_not_restarted(learner, monkeypatch):
  argv, workdir = learner
  for code in supervisor.NO_RESTART:
    monkeypatch.setenv("EXIT", str(code))
    wd = f"{workdir}{code}"
    rc, said = _supervise([*argv[:2], wd], wd, max_restarts=3)
    assert (rc, said) == (code, [])  # the learner printed its own line
    assert len(_log(wd)) == 1 and _state(wd)["restarts"] == 0


def test_a_restart_runs_the_same_command_but_never_discards_the_run(learner, monkeypatch):
  """--discard_stale would delete the run's own checkpoints if the recipe file was edited
  before a restart; a restart drops it, so the changed config stops the run instead."""
  argv, workdir = learner
  monkeypatch.setenv("STEPS", "2")
  monkeypatch.setenv("KILL_AT", "2")
  rc, _ = _supervise([*argv, "--discard_stale", "--config.x=1"], workdir, max_restarts=1)
  assert rc == 0
  got = [r["argv"][1:] for r in _log(workdir)]
  assert got == [["--discard_stale", "--config.x=1"], ["--config.x=1"]]


def test_child_argv_drops_the_supervisor_flags():
  argv = ["launchers/train.py", "--config=c.py", "--max_restarts=3", "--num_processes", "2"]
  argv += ["--devices_per_process=2", "--workdir=/w", "--nodiscard_stale"]
  got = supervisor.child_argv(argv, "launchers.train")
  assert got == [sys.executable, "-m", "launchers.train", "--config=c.py", "--workdir=/w"] + [
    "--nodiscard_stale"
  ]
  assert supervisor.restart_argv([*got, "--discard_stale"]) == got[:-1]


def _popen_supervisor(learner_argv, workdir):
  code = (
    "import sys; from rstar_jax.pipelines.supervisor import Supervisor\n"
    f"sys.exit(Supervisor({learner_argv!r}, {workdir!r}, max_restarts=3, grace_s=5).run())\n"
  )
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  return subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)


def _wait_for_learner(workdir, proc):
  """The first learner's pid, once its row is in log.jsonl: the learner creates the file before
  it writes the row (a poll in between read an empty file, under load: IndexError)."""
  path = os.path.join(workdir, "log.jsonl")
  deadline = time.monotonic() + 60
  while True:
    try:
      with open(path) as f:
        first = f.readline()
    except FileNotFoundError:
      first = ""
    if first.endswith("\n"):
      return json.loads(first)["pid"]
    assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
    time.sleep(0.05)


def _gone(pid, timeout=30):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return True
    try:  # a zombie (exited, not reaped yet) counts as gone
      with open(f"/proc/{pid}/stat") as f:
        if f.read().split(")")[-1].split()[0] == "Z":
          return True
    except FileNotFoundError:
      return True
    time.sleep(0.05)
  return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_supervisor_leaves_no_learner_running(learner, monkeypatch, sig):
  """SIGTERM (a scheduler ending the job): the learners get it, exit 143; SIGKILL: the kernel
  kills the learners (PR_SET_PDEATHSIG), no learner trains on unsupervised."""
  argv, workdir = learner
  monkeypatch.setenv("STEPS", "2")
  monkeypatch.setenv("HANG", "1")
  monkeypatch.setenv("KILL_PROC", "1")
  proc = _popen_supervisor(argv, workdir)
  try:
    pid = _wait_for_learner(workdir, proc)
    proc.send_signal(sig)
    rc = proc.wait(timeout=60)
    assert rc == (143 if sig == signal.SIGTERM else -signal.SIGKILL)
    assert _gone(pid), f"learner {pid} still running after the supervisor got {sig.name}"
    if sig == signal.SIGTERM:
      st = _state(workdir)
      assert st["state"] == "interrupted" and st["attempts"][0]["exits"][0]["signal"] == "SIGTERM"
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()


def _launcher(*args, cwd=REPO):
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.pop("RSTAR_SUPERVISED", None)
  return subprocess.run(
    [sys.executable, "-m", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
  )


def test_bad_supervisor_flags_are_one_line(tmp_path):
  recipe = "--config=configs/rstar2_tiny_cpu.py"
  out = _launcher("launchers.train", recipe, f"--workdir={tmp_path}", "--max_restarts=-1")
  assert out.returncode == 2, out.stderr[-2000:]
  lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
  assert len(lines) == 1 and lines[0].endswith("] --max_restarts: expected >= 0, got -1"), lines
  out = _launcher(
    "launchers.eval",
    "--config=configs/rstar2_tiny_cpu.py:eval",
    f"--out={tmp_path}/e.json",
    "--max_restarts=1",
  )
  assert out.returncode == 2, out.stderr[-2000:]
  assert "--max_restarts: only launchers.train and launchers.sft supervise" in out.stderr
  assert "Traceback" not in out.stderr


def test_process_envs_give_each_process_its_device_count_and_a_shared_coordinator(monkeypatch):
  """``--devices_per_process`` (the two-process supervised run of the long tier): each learner
  process's ``XLA_FLAGS`` keeps the other flags and carries one device-count flag, this one;
  the processes of one attempt share a coordinator and have their own ids."""
  monkeypatch.setenv(
    "XLA_FLAGS", "--xla_cpu_use_fusion_emitters=false --xla_force_host_platform_device_count=8"
  )
  envs = supervisor.process_envs(2, devices_per_process=2, attempt=1)
  for i, env in enumerate(envs):
    assert env["XLA_FLAGS"] == (
      "--xla_cpu_use_fusion_emitters=false --xla_force_host_platform_device_count=2"
    )
    assert env["RSTAR_PROCESS_ID"] == str(i) and env["RSTAR_NUM_PROCESSES"] == "2"
    assert env[supervisor.ENV_RESTARTS] == "1" and env[supervisor.ENV_SUPERVISED] == "1"
  assert envs[0]["RSTAR_COORDINATOR"] == envs[1]["RSTAR_COORDINATOR"]
  monkeypatch.delenv("XLA_FLAGS")
  (one,) = supervisor.process_envs(1, devices_per_process=3)
  assert one["XLA_FLAGS"] == "--xla_force_host_platform_device_count=3"
  assert "RSTAR_COORDINATOR" not in one
