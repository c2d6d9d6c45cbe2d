"""scripts/compare_runs.py: exact per-step metrics (wall-clock keys aside) and final weights."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_dir(path, rows, weights=b"\x00\x01"):
  os.makedirs(path / "rl" / "hf")
  with open(path / "rl" / "metrics.jsonl", "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  (path / "rl" / "hf" / "model.safetensors").write_bytes(weights)
  return str(path)


def _compare(a, b, *extra):
  return subprocess.run(
    [sys.executable, os.path.join(ROOT, "scripts", "compare_runs.py"), a, b, *extra],
    capture_output=True,
    text=True,
  )


def test_compare_runs_exact_metrics_and_weights(tmp_path):
  row = {"step": 1, "loss": 0.25, "time_step_s": 1.0, "async/learner_idle_frac": 0.5}
  a = _run_dir(tmp_path / "a", [row])
  # Wall-clock values differ between runs and are not compared.
  b = _run_dir(tmp_path / "b", [dict(row, time_step_s=9.0, **{"async/learner_idle_frac": 0.1})])
  same = _compare(a, b)
  assert same.returncode == 0 and "identical" in same.stdout, same.stdout

  c = _run_dir(tmp_path / "c", [dict(row, loss=0.25 + 1e-12)])  # no tolerance
  d = _run_dir(tmp_path / "d", [row], weights=b"\x00\x02")
  e = _run_dir(tmp_path / "e", [row, dict(row, step=2)])
  for other, want in ((c, "step 1 loss"), (d, "model.safetensors differs"), (e, "only in B")):
    out = _compare(a, other)
    assert out.returncode == 1 and want in out.stdout, out.stdout


def test_ignore_leaves_out_only_the_named_key_and_says_so(tmp_path):
  row = {"step": 1, "loss": 0.25, "sampler_logprob_drift": 1e-7}
  a = _run_dir(tmp_path / "a", [row])
  b = _run_dir(tmp_path / "b", [dict(row, sampler_logprob_drift=1.1e-7)])
  assert _compare(a, b).returncode == 1
  out = _compare(a, b, "--ignore", "sampler_logprob_drift")
  assert out.returncode == 0 and "left out" in out.stdout and "identical" in out.stdout, out.stdout
  c = _run_dir(tmp_path / "c", [dict(row, loss=0.5, sampler_logprob_drift=1.1e-7)])
  out = _compare(a, c, "--ignore", "sampler_logprob_drift")
  assert out.returncode == 1 and "step 1 loss" in out.stdout, out.stdout
