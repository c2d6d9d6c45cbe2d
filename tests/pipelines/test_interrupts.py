"""Ctrl-C (issue 29 row 13): SFT checkpoints the step reached on interrupt (a resumed run
continues there), and a launcher ends with one line "interrupted at step N; rerun the same
command to resume" and exit status 130 instead of chained tracebacks."""

import json
import logging

import pytest

from configs import rstar2_tiny_cpu
from rstar_jax import cli
from rstar_jax.config import from_config_dict
from rstar_jax.learner.checkpoint import Checkpointer
from rstar_jax.pipelines import data_sources, sft_loop
from rstar_jax.pipelines.metrics_log import Progress


def _interrupted_sft(tmp_path, monkeypatch):
  """An SFT run of 3 steps (6 items, batch 2, no periodic checkpoint) Ctrl-C'd after step 2."""
  cfg = rstar2_tiny_cpu.get_config("sft")
  cfg.data.synthetic.n_train = 6
  cfg.sft.epochs, cfg.sft.batch_size, cfg.sft.max_seq_len = 1, 2, 1024
  cfg.train.checkpoint_every = 0  # only at the end: before, an interrupt saved nothing
  cfg.mesh.num_devices = 1
  run = from_config_dict(cfg)
  examples = data_sources.sft_examples(run)
  tok = data_sources.ensure_tokenizer(
    run,
    str(tmp_path / "tok"),
    data_sources.tokenizer_corpus(data_sources.train_problems(run), examples),
  )

  class CtrlCAtStep2(Progress):
    def update(self, done, *a, **k):
      if done == 2:  # after step 2's update, before any periodic save
        raise KeyboardInterrupt
      return super().update(done, *a, **k)

  w = tmp_path / "run"
  monkeypatch.setattr(sft_loop, "Progress", CtrlCAtStep2)
  with pytest.raises(KeyboardInterrupt):
    sft_loop.run_sft(run, str(w), tokenizer=tok, examples=examples, export=False)
  monkeypatch.setattr(sft_loop, "Progress", Progress)
  return run, tok, examples, w


def test_sft_checkpoints_on_interrupt(tmp_path, monkeypatch):
  _, _, _, w = _interrupted_sft(tmp_path, monkeypatch)
  with Checkpointer(str(w / "ckpt")) as ck:
    assert ck.all_steps() == [2]
  assert cli.interrupted_line(str(w), "sft_metrics") == (
    "interrupted at step 2; rerun the same command to resume"
  )
  meta = json.loads((w / "ckpt" / "2" / "meta" / "metadata").read_text())
  assert meta["phase"] == "sft" and meta["data"]["index"] == 4  # 2 batches of 2 consumed


@pytest.mark.slow
def test_sft_rerun_after_interrupt_continues_from_its_checkpoint(tmp_path, monkeypatch):
  run, tok, examples, w = _interrupted_sft(tmp_path, monkeypatch)
  # Step 3 (the last) is the only step the rerun trains.
  out = sft_loop.run_sft(run, str(w), tokenizer=tok, examples=examples, export=False)
  assert out["steps"] == 3
  steps = [json.loads(x)["step"] for x in (w / "sft_metrics.jsonl").read_text().splitlines()]
  assert steps == [1, 2, 3]


def test_launcher_interrupt_is_one_line_naming_the_step(tmp_path, caplog):
  (tmp_path / "metrics.jsonl").write_text(
    "\n".join(json.dumps({"step": s, "loss": 0.1}) for s in (1, 2, 3)) + "\n"
  )
  (tmp_path / "ckpt").mkdir()
  (tmp_path / "ckpt" / "loop_position.json").write_text(json.dumps({"loop": {"rl_step": 2}}))

  def main(argv):
    raise KeyboardInterrupt

  with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as e:
    cli.wrap(main, lambda: cli.rl_interrupted_line(str(tmp_path)))([])
  assert e.value.code == 130
  assert [r.getMessage() for r in caplog.records] == [
    "interrupted at step 3; rerun the same command to resume (from the checkpoint of step 2; "
    "the steps after it are redone)"
  ]
  caplog.clear()
  with caplog.at_level(logging.ERROR), pytest.raises(SystemExit):
    cli.wrap(main)([])
  assert [r.getMessage() for r in caplog.records] == [
    "interrupted; rerun the same command to resume"
  ]


@pytest.mark.slow
def test_ctrl_c_during_rl_training_is_one_line(tmp_path):
  """A real SIGINT to `launchers.train` after its first step: exit 130, the line naming the
  step, and no traceback (before: two chained tracebacks)."""
  import os
  import signal
  import subprocess
  import sys
  import time

  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  w = tmp_path / "rl"
  # The tiny recipe's 4 steps can all finish between the first logged step and the signal
  # (later steps take ~0.3 s): a long first stage keeps the run training when SIGINT lands.
  recipe = tmp_path / "long_tiny.py"
  recipe.write_text(
    "from configs import rstar2_tiny_cpu\n\n\ndef get_config():\n"
    "  c = rstar2_tiny_cpu.get_config()\n  c.stages[0]['steps'] = 10_000\n  return c\n"
  )
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "launchers.train",
      f"--config={recipe}",
      f"--workdir={w}",
      "--config.mesh.num_devices=1",
    ],
    cwd=repo,
    env=dict(os.environ, XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""), JAX_PLATFORMS="cpu"),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    # A suite started in the background (`cmd &` in a script) inherits SIGINT ignored, and
    # Python then installs no KeyboardInterrupt handler: give the run Ctrl-C's default back.
    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
  )
  try:
    deadline = time.monotonic() + 400
    while not (w / "metrics.jsonl").is_file() or not (w / "metrics.jsonl").read_text():
      assert proc.poll() is None, proc.communicate()[1][-3000:]
      assert time.monotonic() < deadline, "no RL step logged"
      time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 130, err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  lines = [ln for ln in err.splitlines() if "interrupted at step" in ln]
  assert len(lines) == 1 and "rerun the same command to resume" in lines[0], err[-3000:]


@pytest.mark.slow
def test_real_sigint_while_a_step_is_recorded_names_one_step(tmp_path, monkeypatch, request):
  """Issue 43 row 4: a real SIGINT landing while SFT records step 2 (after its update, while
  its metric row is written). Before: "checkpoint of step 2 written", then "interrupted at
  step 1", and the resumed log lacked row 2. Now: one step number and no lost or doubled row."""
  import os
  import signal

  from rstar_jax.pipelines import metrics_log

  cfg = rstar2_tiny_cpu.get_config("sft")
  cfg.data.synthetic.n_train = 6
  cfg.sft.epochs, cfg.sft.batch_size, cfg.sft.max_seq_len = 1, 2, 1024
  cfg.train.checkpoint_every = 0
  cfg.mesh.num_devices = 1
  run = from_config_dict(cfg)
  examples = data_sources.sft_examples(run)
  tok = data_sources.ensure_tokenizer(
    run,
    str(tmp_path / "tok"),
    data_sources.tokenizer_corpus(data_sources.train_problems(run), examples),
  )

  class SigintWhileWritingRow2(metrics_log.MetricsWriter):
    def write(self, step, metrics):
      if step == 2:
        os.kill(os.getpid(), signal.SIGINT)  # delivered at the next bytecode, mid-write
      return super().write(step, metrics)

  w = tmp_path / "run"
  monkeypatch.setattr(sft_loop, "MetricsWriter", SigintWhileWritingRow2)
  # Python's own Ctrl-C handler, as in a launcher (a pytest-xdist worker ignores SIGINT).
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))

  def main(argv):
    sft_loop.run_sft(run, str(w), tokenizer=tok, examples=examples, export=False)

  with pytest.raises(SystemExit) as e:
    cli.wrap(main, lambda: cli.sft_interrupted_line(str(w)))([])
  assert e.value.code == 130
  with Checkpointer(str(w / "ckpt")) as ck:
    assert ck.all_steps() == [2]
  rows = [json.loads(x)["step"] for x in (w / "sft_metrics.jsonl").read_text().splitlines()]
  assert rows == [1, 2]
  assert cli.sft_interrupted_line(str(w)) == (
    "interrupted at step 2; rerun the same command to resume"
  )
  monkeypatch.setattr(sft_loop, "MetricsWriter", metrics_log.MetricsWriter)
  out = sft_loop.run_sft(run, str(w), tokenizer=tok, examples=examples, export=False)
  assert out["steps"] == 3
  rows = [json.loads(x)["step"] for x in (w / "sft_metrics.jsonl").read_text().splitlines()]
  assert rows == [1, 2, 3]
