"""scripts/gpu_check.sh --smoke runs on CPU and writes a report with every section."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(tmp_path, *extra):
  out = tmp_path / "report" / "gpu_check.json"
  env = dict(os.environ, PYTHON=sys.executable)
  env.pop("XLA_FLAGS", None)  # one CPU device, as on a one-GPU machine
  p = subprocess.run(
    ["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), "--smoke", "--out", str(out), *extra],
    env=env,
    capture_output=True,
    text=True,
    timeout=1200,
  )
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  return json.loads(out.read_text())


def _check_decode(res):
  assert res["ok"], (res.get("error"), res.get("stderr_tail", "")[-2000:])
  assert res["bandwidth"]["gb_per_s"] > 0
  r = res["results"]
  for b in ("batch1", "batch4"):
    assert r[b]["jax_tokens_per_s"] > 0 and r[b]["transformers_tokens_per_s"] > 0, r[b]
    assert r[b]["roofline_ms_per_step"] > 0 and r[b]["fraction_of_roofline"] > 0
    assert r[b]["greedy_rows_identical"] == 1.0  # float32, same weights: same greedy tokens
  assert r["max_len"]["max_len_64_ms_per_token"] > 0 and r["max_len"]["ratio"] > 0
  conv = r["prefill_10_turns"]
  # Under the lease the 10 turns prefill far less than the sum of their inputs.
  assert 0 < conv["prefill_tokens"] < conv["sum_of_turn_inputs"] // 3, conv


def test_gpu_check_smoke_runs_only_the_sections_asked(tmp_path):
  """--sections picks sections by name (the GPU run uses `--sections decode`); here the cheap
  dlpack one. The decode section itself is checked by the every-section run below (run twice,
  it cost ~1 min quiet, ~4 min on a loaded 2-core machine)."""
  report = _run(tmp_path, "--sections", "dlpack")
  assert set(report["sections"]) == {"dlpack"}
  res = report["sections"]["dlpack"]
  assert res["ok"], (res.get("error"), res.get("stderr_tail", "")[-2000:])
  assert res["zero_copy"] and res["values_ok"]


@pytest.mark.slow
def test_gpu_check_smoke_writes_every_section(tmp_path):
  out = tmp_path / "report" / "gpu_check.json"
  env = dict(os.environ, PYTHON=sys.executable)
  env.pop("XLA_FLAGS", None)  # one CPU device, as on a one-GPU machine
  p = subprocess.run(
    ["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), "--smoke", "--out", str(out)],
    env=env,
    capture_output=True,
    text=True,
    timeout=1200,
  )
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  report = json.loads(out.read_text())
  sections = report["sections"]
  assert set(sections) == {"env", "learner", "decode", "dlpack", "rl_loop"}
  for name, res in sections.items():
    assert res["ok"], (name, res.get("error"), res.get("stderr_tail", "")[-2000:])
  learner = sections["learner"]["results"]
  for impl in ("xla", "blockwise", "fused"):
    assert learner[impl]["tokens_per_s"] > 0, (impl, learner[impl])
  # Same init, same batch: the three attentions give the same first loss.
  assert abs(learner["blockwise"]["loss"] - learner["xla"]["loss"]) < 1e-4
  _check_decode(sections["decode"])
  assert sections["dlpack"]["zero_copy"] and sections["dlpack"]["values_ok"]
  assert sections["rl_loop"]["rl_step"] == 2
