"""`launchers.sft --max_restarts=N` for real (issue 41 item 4): a learner process killed with
SIGKILL mid-run (one process, and one of two jax.distributed processes on 127.0.0.1) is
restarted from its last checkpoint and the run ends with the metrics and weights of an
undisturbed run; a recipe edited before a restart stops the run instead of changing it.

The undisturbed reference writes its checkpoints synchronously and the killed run
asynchronously (the default), so the exact match also shows that async writes do not change
a run. Slow: each run compiles the tiny model (~20 s on a busy 2-core machine)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import compare_metrics  # noqa: E402
import compare_runs  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 8  # tiny SFT: 4 items, batch 4 -> one step per epoch


def _env(**extra):
  env = dict(
    os.environ,
    PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""),
    PYTHONUNBUFFERED="1",
  )
  for k in ("RSTAR_COORDINATOR", "RSTAR_NUM_PROCESSES", "RSTAR_PROCESS_ID", "RSTAR_SUPERVISED"):
    env.pop(k, None)
  env.update(extra)
  return env


def _sft(workdir, *args, config="configs/rstar2_tiny_cpu.py:sft", kill=None, timeout=900):
  """Runs launchers.sft; ``kill=(process, after_rows)``: SIGKILL learner ``process`` of the
  first attempt once sft_metrics.jsonl has ``after_rows`` rows and a checkpoint is complete
  (``before_kill(workdir)`` runs first when given as a third item)."""
  cmd = [sys.executable, "-m", "launchers.sft", f"--config={config}", f"--workdir={workdir}"]
  cmd += [f"--config.sft.epochs={float(STEPS)}", *args]
  proc = subprocess.Popen(
    cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  killed = {}
  if kill:
    t = threading.Thread(target=_killer, args=(proc, workdir, kill, killed), daemon=True)
    t.start()
  try:
    out, err = proc.communicate(timeout=timeout)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  return proc.returncode, out, err, killed


def _rows(workdir):
  try:
    with open(os.path.join(workdir, "sft_metrics.jsonl")) as f:
      return [json.loads(line) for line in f if line.strip()]
  except (OSError, ValueError):
    return []


def _killer(proc, workdir, kill, killed):
  process, after_rows = kill[:2]
  ck = os.path.join(workdir, "ckpt")
  while proc.poll() is None:
    try:
      with open(os.path.join(workdir, "supervisor.json")) as f:
        st = json.load(f)
    except (OSError, ValueError):
      st = None
    steps = [n for n in os.listdir(ck) if n.isdigit()] if os.path.isdir(ck) else []
    if st and len(_rows(workdir)) >= after_rows and steps:
      if len(kill) > 2:
        kill[2](workdir)
      killed["rows"] = len(_rows(workdir))
      killed["pid"] = st["attempts"][0]["pids"][process]
      os.kill(killed["pid"], signal.SIGKILL)
      return
    time.sleep(0.05)


def _metrics(workdir):
  out = compare_metrics.load(os.path.join(workdir, "sft_metrics.jsonl"))
  for row in out.values():
    for k in [k for k in row if compare_runs.is_wall_clock(k) or k in compare_runs.RUN_HISTORY]:
      del row[k]
  return out


def _weights(workdir):
  with open(os.path.join(workdir, "hf", "model.safetensors"), "rb") as f:
    return f.read()


def _supervisor_state(workdir):
  with open(os.path.join(workdir, "supervisor.json")) as f:
    return json.load(f)


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
  w = str(tmp_path_factory.mktemp("sup") / "undisturbed")
  rc, _, err, _ = _sft(w, "--max_restarts=1", "--config.train.async_checkpoints=False")
  assert rc == 0, err[-4000:]
  assert {r["restarts"] for r in _rows(w)} == {0}
  return w


def test_a_learner_killed_mid_run_restarts_and_ends_as_the_undisturbed_run(undisturbed, tmp_path):
  w = str(tmp_path / "killed")
  rc, out, err, killed = _sft(w, "--max_restarts=2", kill=(0, 3))
  assert rc == 0, err[-4000:]
  assert killed, "the learner was never killed"
  assert killed["rows"] < STEPS, "the run ended before the kill: nothing tested"
  lines = [ln for ln in err.splitlines() if ln.startswith("supervisor: ")]
  assert len(lines) == 1, err[-4000:]
  assert lines[0].startswith(f"supervisor: learner process 0 (pid {killed['pid']}) was killed")
  assert "restart 1 of 2 from the checkpoint of step" in lines[0]
  st = _supervisor_state(w)
  assert st["state"] == "done" and st["restarts"] == 1
  resumed = st["attempts"][1]["resumed_from_step"]
  assert resumed is not None and 1 <= resumed < STEPS
  rows = _rows(w)
  assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # none lost, none doubled
  assert [r["restarts"] for r in rows] == [0] * resumed + [1] * (STEPS - resumed)
  assert _metrics(w) == _metrics(undisturbed)
  assert _weights(w) == _weights(undisturbed)
  assert json.loads(out)["total_steps"] == STEPS
  assert not [n for n in os.listdir(os.path.join(w, "ckpt")) if "tmp" in n]


def test_a_recipe_edited_before_a_restart_stops_the_run(tmp_path):
  """The restart reads the recipe file again; run_record refuses the changed config (one line,
  exit 2, no further restart), and --discard_stale given at the first start does not wipe the
  run's checkpoints on the restart."""
  recipe = tmp_path / "my_recipe.py"
  text = (
    "from configs import rstar2_tiny_cpu\n\n\ndef get_config():\n"
    "  c = rstar2_tiny_cpu.get_config('sft')\n  c.optim.lr = {lr}\n  return c\n"
  )
  recipe.write_text(text.format(lr=0.01))
  w = str(tmp_path / "edited")

  def edit(_):
    recipe.write_text(text.format(lr=0.02))

  rc, _, err, killed = _sft(
    w, "--max_restarts=3", "--discard_stale", config=str(recipe), kill=(0, 1, edit)
  )
  assert killed and rc == 2, err[-4000:]
  st = _supervisor_state(w)
  assert st["restarts"] == 1 and st["state"] == "failed", st
  stale = [ln for ln in err.splitlines() if "config changed since they ran" in ln]
  assert len(stale) == 1 and "optim.lr 0.01 -> 0.02" in stale[0], err[-4000:]
  assert [n for n in os.listdir(os.path.join(w, "ckpt")) if n.isdigit()]  # not discarded


@pytest.mark.long
def test_one_of_two_jax_processes_killed_restarts_both(undisturbed, tmp_path):
  """2 jax.distributed processes (1 CPU device each, coordinator on 127.0.0.1): process 1 is
  killed; the supervisor ends process 0 (waiting on its dead peer) and restarts both from the
  last checkpoint. Two processes reduce in another order than one: compared with the
  1-process run with tolerance (tests/distributed/test_multiprocess.py does the same; the
  largest difference measured after these 8 steps at lr 1e-2 was 1.7e-5 in one weight of
  8192); the exact check of a restart is the 1-process test above."""
  w = str(tmp_path / "two")
  args = ("--max_restarts=1", "--num_processes=2", "--devices_per_process=1")
  rc, _, err, killed = _sft(w, *args, kill=(1, 2))
  assert rc == 0, err[-4000:]
  assert killed and killed["rows"] < STEPS
  lines = [ln for ln in err.splitlines() if ln.startswith("supervisor: ")]
  assert len(lines) == 1 and lines[0].endswith("all 2 processes"), err[-4000:]
  st = _supervisor_state(w)
  assert st["restarts"] == 1 and st["state"] == "done"
  assert {e["process"]: e["signal"] for e in st["attempts"][0]["exits"]}[1] == "SIGKILL"
  assert len(st["attempts"][1]["pids"]) == 2
  assert [r["step"] for r in _rows(w)] == list(range(1, STEPS + 1))
  assert compare_metrics.compare(_metrics(undisturbed), _metrics(w), 1e-4, 1e-6) == []
  from safetensors.numpy import load_file

  a = load_file(os.path.join(undisturbed, "hf", "model.safetensors"))
  b = load_file(os.path.join(w, "hf", "model.safetensors"))
  assert sorted(a) == sorted(b)
  for k in a:
    np.testing.assert_allclose(a[k], b[k], atol=1e-4, rtol=1e-3, err_msg=k)
