"""Issue 43 row 2 as the user met it: `launchers.sft` whose workdir's disk fills up. Before:
a 1,027-line log (RESOURCE_EXHAUSTED, ~80 tracebacks, "Event loop is closed"). Now: one line
naming the path and the last good checkpoint, exit 2; a rerun with space resumes from it."""

import contextlib
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@contextlib.contextmanager
def small_tmpfs(path, size: str):
  """A tmpfs of ``size`` mounted at ``path`` (root only: skipped elsewhere)."""
  os.makedirs(path, exist_ok=True)
  r = subprocess.run(
    ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
    capture_output=True,
    text=True,
  )
  if r.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); needs root")
  try:
    yield str(path)
  finally:
    subprocess.run(["umount", "-l", str(path)], check=False)


def _sft(workdir, *extra):
  return subprocess.run(
    [
      sys.executable,
      "-m",
      "launchers.sft",
      "--config=configs/rstar2_tiny_cpu.py:sft",
      f"--workdir={workdir}",
      "--config.train.checkpoint_every=1",
      "--config.mesh.num_devices=1",
      *extra,
    ],
    cwd=REPO,
    env=dict(os.environ, XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""), JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
    timeout=600,
  )


@pytest.mark.slow
def test_sft_on_a_full_disk_is_one_line_and_resumes_from_the_last_good_checkpoint(tmp_path):
  with small_tmpfs(tmp_path / "disk", "3m") as disk:  # one tiny checkpoint fits, two do not
    w = os.path.join(disk, "run")
    proc = _sft(w)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Event loop is closed" not in proc.stderr
    ck = os.path.join(w, "ckpt")
    assert errors[0].endswith(
      f"checkpoint {ck}: cannot write step 2 (no space left on device); the last good "
      f"checkpoint is step 1 ({ck}/1): free space, then rerun the same command to resume"
    )
    subprocess.run(["mount", "-o", "remount,size=64m", disk], check=True)
    proc = _sft(w, "--max_steps=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SFT resumed at step 1" in proc.stderr
    steps = [json.loads(x)["step"] for x in open(os.path.join(w, "sft_metrics.jsonl"))]
    assert steps == [1, 2, 3]  # the failed run's step 2 row is replaced, not doubled
    names = os.listdir(ck)
    assert "3" in names and not [n for n in names if "tmp" in n]  # the cut write was removed
