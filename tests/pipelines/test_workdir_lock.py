"""Issue 43 row 3: the same `launchers.train ... --workdir=D` started twice. Before, both ran
to rc 0 into the same ckpt/ and metrics.jsonl; now the second stops with one line, and a
holder killed with SIGKILL leaves no stuck lock."""

import os
import signal
import subprocess
import sys

import pytest

from rstar_jax.pipelines import workdir_lock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""), JAX_PLATFORMS="cpu")
HOLD = (
  "import sys, time\n"
  "from rstar_jax.pipelines import workdir_lock\n"
  "workdir_lock.acquire(sys.argv[1])\n"
  "print('held', flush=True)\n"
  "time.sleep(600)\n"
)


def _holder(workdir):
  """A separate process holding ``workdir``'s lock (as a running launcher does)."""
  proc = subprocess.Popen(
    [sys.executable, "-c", HOLD, str(workdir)], cwd=REPO, env=ENV, stdout=subprocess.PIPE, text=True
  )
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_second_launch_into_a_busy_workdir_is_refused_with_one_line(tmp_path):
  w = tmp_path / "rl"
  holder = _holder(w)
  try:
    proc = subprocess.run(
      [
        sys.executable,
        "-m",
        "launchers.train",
        "--config=configs/rstar2_tiny_cpu.py",
        f"--workdir={w}",
      ],
      cwd=REPO,
      env=ENV,
      capture_output=True,
      text=True,
      timeout=300,
    )
  finally:
    holder.kill()
    holder.wait()
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  errors = [line for line in lines if " ERROR " in line]
  assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert f"--workdir: {w} is in use by another run (pid {holder.pid} on " in errors[0]
  assert "wait for it to end or give another --workdir" in errors[0]
  assert not (w / "ckpt").exists() and not (w / "metrics.jsonl").exists()  # nothing written
  # Issue 43 row 14: the start-up line says what the run uses (before the lock is checked).
  assert (
    "launchers.train: model from scratch (config.model); chat format 'rstar2'; reward 'math' "
    "(verifier 'math_verify'); LoRA off (full fine-tuning); policy loss "
  ) in proc.stderr


def test_a_killed_holder_leaves_no_stuck_lock(tmp_path):
  holder = _holder(tmp_path)
  with pytest.raises(workdir_lock.WorkdirBusyError):
    # A second process's view: POSIX locks never conflict within one process.
    _acquire_in_child(tmp_path)
  os.kill(holder.pid, signal.SIGKILL)
  holder.wait()
  assert _acquire_in_child(tmp_path) == str(tmp_path / ".lock")


def test_processes_of_one_job_lock_their_own_files(tmp_path):
  holder = _holder(tmp_path)  # process 0
  try:
    assert _acquire_in_child(tmp_path, RSTAR_PROCESS_ID="1") == str(tmp_path / ".lock.1")
    with pytest.raises(workdir_lock.WorkdirBusyError):
      _acquire_in_child(tmp_path, RSTAR_PROCESS_ID="0")
  finally:
    holder.kill()
    holder.wait()


def _acquire_in_child(workdir, **env):
  code = (
    "import sys\nfrom rstar_jax.pipelines import workdir_lock\n"
    "try:\n  print(workdir_lock.acquire(sys.argv[1]))\n"
    "except workdir_lock.WorkdirBusyError as e:\n  print('BUSY', e); sys.exit(3)\n"
  )
  p = subprocess.run(
    [sys.executable, "-c", code, str(workdir)],
    cwd=REPO,
    env=dict(ENV, **env),
    capture_output=True,
    text=True,
    timeout=120,
  )
  if p.returncode == 3:
    raise workdir_lock.WorkdirBusyError(p.stdout)
  assert p.returncode == 0, p.stderr
  return p.stdout.strip()
