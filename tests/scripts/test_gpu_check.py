"""scripts/gpu_check.sh --smoke runs on CPU and writes a report with every section."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
  assert set(sections) == {"env", "learner", "sampler", "dlpack", "rl_loop"}
  for name, res in sections.items():
    assert res["ok"], (name, res.get("error"), res.get("stderr_tail", "")[-2000:])
  learner = sections["learner"]["results"]
  for impl in ("xla", "blockwise", "fused"):
    assert learner[impl]["tokens_per_s"] > 0, (impl, learner[impl])
  # Same init, same batch: the three attentions give the same first loss.
  assert abs(learner["blockwise"]["loss"] - learner["xla"]["loss"]) < 1e-4
  for b in ("batch1", "batch4"):
    r = sections["sampler"]["results"][b]
    assert r["jax_sampler"]["tokens_per_s"] > 0 and r["transformers"]["tokens_per_s"] > 0
    assert r["greedy_rows_identical"] == 1.0  # float32, same weights: same greedy tokens
  assert sections["dlpack"]["zero_copy"] and sections["dlpack"]["values_ok"]
  assert sections["rl_loop"]["rl_step"] == 2
