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


def _phases_until_rl_is_interrupted(monkeypatch, at_step):
  """`demo.run_demo`'s phases replaced by stand-ins that leave what the real ones leave for the
  interrupt line: data to eval_sft finish at once; RL logs ``at_step`` rows, checkpoints the
  loop position of step ``at_step - 1`` and is interrupted (the long test above does this with
  a real SIGINT during a real run)."""
  from rstar_jax.pipelines import demo

  def rl(cfg, workdir, *a, **k):
    rdir = os.path.join(workdir, "rl")
    os.makedirs(os.path.join(rdir, "ckpt"), exist_ok=True)
    with open(os.path.join(rdir, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps({"step": s}) + "\n" for s in range(1, at_step + 1))
    with open(os.path.join(rdir, "ckpt", "loop_position.json"), "w") as f:
      json.dump({"loop": {"rl_step": at_step - 1}}, f)
    raise KeyboardInterrupt

  monkeypatch.setattr(demo, "phase_data", lambda *a: [])
  monkeypatch.setattr(demo, "phase_tokenizer", lambda *a: None)
  monkeypatch.setattr(demo, "check_heldout_prompts", lambda *a: None)
  monkeypatch.setattr(demo, "phase_sft", lambda *a: {})
  monkeypatch.setattr(demo, "phase_eval", lambda *a: {})
  monkeypatch.setattr(demo, "phase_rl", rl)


def test_an_interrupted_demo_keeps_its_phase_and_adds_its_time(tmp_path, monkeypatch):
  """The bookkeeping of the long test above without the runs: an interrupt during RL leaves
  ``last_phase`` at the last finished phase and adds the interrupted run's time to the earlier
  runs' (``elapsed_s``), and the launcher's line names the phase and the step."""
  from configs import demo as demo_config
  from rstar_jax import cli
  from rstar_jax.config import from_config_dict
  from rstar_jax.pipelines import demo

  cfg = from_config_dict(demo_config.get_config("smoke"))
  w = tmp_path / "run"
  _phases_until_rl_is_interrupted(monkeypatch, at_step=3)
  with pytest.raises(KeyboardInterrupt):
    demo.run_demo(cfg, str(w))
  first = json.loads((w / "demo_state.json").read_text())
  assert first["last_phase"] == "eval_sft" and first["elapsed_s"] > 0
  assert cli.demo_interrupted_line(str(w)) == (
    "interrupted in phase rl at step 3; rerun the same command to resume"
    " (from the checkpoint of step 2; the steps after it are redone)"
  )
  # A second run resumes and is interrupted again: its time is added to the first's.
  (w / "demo_state.json").write_text(json.dumps({"last_phase": "eval_sft", "elapsed_s": 100.0}))
  _phases_until_rl_is_interrupted(monkeypatch, at_step=4)
  with pytest.raises(KeyboardInterrupt):
    demo.run_demo(cfg, str(w))
  second = json.loads((w / "demo_state.json").read_text())
  assert second["last_phase"] == "eval_sft" and second["elapsed_s"] > 100.0


@pytest.mark.parametrize(
  "state, line",
  [
    (None, "interrupted in phase data; rerun the same command to resume"),
    ({"last_phase": "data"}, "interrupted in phase tokenizer; rerun the same command to resume"),
    (
      {"last_phase": "tokenizer"},
      "interrupted in phase sft at step 2; rerun the same command to resume",
    ),
    (
      {"last_phase": "rl (unfinished)"},  # demo.rl_max_steps stopped the last run inside RL
      "interrupted in phase rl at step 5; rerun the same command to resume"
      " (from the checkpoint of step 0; the steps after it are redone)",
    ),
    ({"last_phase": "eval_rl"}, "interrupted in phase report; rerun the same command to resume"),
    ({"last_phase": "report"}, "interrupted in phase report; rerun the same command to resume"),
    ("not json", "interrupted in phase data; rerun the same command to resume"),
  ],
  ids=["fresh", "data", "tokenizer", "rl_unfinished", "eval_rl", "report", "unreadable"],
)
def test_demo_interrupted_line_names_the_phase_after_the_last_finished_one(tmp_path, state, line):
  from rstar_jax import cli

  (tmp_path / "sft" / "ckpt" / "2").mkdir(parents=True)  # SFT: its checkpoint is the resume point
  (tmp_path / "sft" / "sft_metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
  (tmp_path / "rl").mkdir()  # RL: five rows logged, no checkpoint
  (tmp_path / "rl" / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in range(1, 6)))
  if state is not None:
    (tmp_path / "demo_state.json").write_text(
      state if isinstance(state, str) else json.dumps(state)
    )
  assert cli.demo_interrupted_line(str(tmp_path)) == line


def test_sft_only_stops_after_the_sft_evaluation(tmp_path, monkeypatch):
  """``run_demo(sft_only=True)`` (claims.py readies a cold start's SFT model for other runs):
  the phases up to the SFT evaluation run, RL does not, the SFT report comes back, and a later
  full run of the same workdir goes on from there."""
  from configs import demo as demo_config
  from rstar_jax.config import from_config_dict
  from rstar_jax.pipelines import demo

  cfg = from_config_dict(demo_config.get_config("smoke"))
  w = tmp_path / "run"
  _phases_until_rl_is_interrupted(monkeypatch, at_step=1)
  monkeypatch.setattr(demo, "phase_eval", lambda *a: {"metrics": {"accuracy": 0.25}})
  assert demo.run_demo(cfg, str(w), sft_only=True) == {"metrics": {"accuracy": 0.25}}
  assert json.loads((w / "demo_state.json").read_text())["last_phase"] == "eval_sft"
  assert not (w / "rl").exists()
  with pytest.raises(KeyboardInterrupt):  # the full run reaches RL (stood in: interrupted)
    demo.run_demo(cfg, str(w))
  assert (w / "rl" / "metrics.jsonl").exists()
