"""Issue 43 row 11: Ctrl-C (a real SIGINT) during `launchers.demo`. Before: "interrupted;
rerun ..." without the step, and the summary's wall time counted only up to the last finished
phase of the interrupted run (901 s for runs of 1,497 + 313 s). Now: the phase and step in
the line, and the interrupted run's time is recorded for the summary's sum."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rows(path):
  try:
    return [json.loads(x) for x in open(path) if x.strip()]
  except (OSError, ValueError):
    return []


@pytest.mark.long
@pytest.mark.slow
def test_ctrl_c_during_the_demo_names_phase_and_step_and_keeps_the_time(tmp_path):
  recipe = tmp_path / "long_smoke.py"
  # A long RL stage keeps the demo training when SIGINT lands (the smoke's 3 steps are fast).
  recipe.write_text(
    "from configs import demo\n\n\ndef get_config():\n"
    "  c = demo.get_config('smoke')\n  c.stages[0]['steps'] = 10_000\n  return c\n"
  )
  w = tmp_path / "run"
  proc = subprocess.Popen(
    [sys.executable, "-m", "launchers.demo", f"--config={recipe}", f"--workdir={w}"],
    cwd=REPO,
    env=dict(os.environ, XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""), JAX_PLATFORMS="cpu"),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
  )
  try:
    deadline = time.monotonic() + 500
    while not _rows(w / "rl" / "metrics.jsonl"):
      assert proc.poll() is None, proc.communicate()[1][-3000:]
      assert time.monotonic() < deadline, "no RL step within the deadline"
      time.sleep(0.5)
    before = json.loads((w / "demo_state.json").read_text())
    assert before["last_phase"] == "eval_sft"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 130, err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  errors = [line for line in err.splitlines() if " ERROR " in line]
  step = _rows(w / "rl" / "metrics.jsonl")[-1]["step"]
  assert len(errors) == 1 and "interrupted in phase rl at step " in errors[0], err[-3000:]
  assert errors[0].split("interrupted in phase rl at step ")[1].startswith(f"{step};")
  after = json.loads((w / "demo_state.json").read_text())
  # The interrupted run's time (RL steps included) is kept for the summary's sum.
  assert after["last_phase"] == "eval_sft" and after["elapsed_s"] > before["elapsed_s"]
