"""benchmarks/moe.py --json prints one JSON document with every form's ratio, and the
``moe`` section of the GPU check runs on CPU (smoke sizes). No timing is asserted."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  return env


@pytest.mark.slow  # 8 small programs to compile: ~1 min on a loaded 2-core machine
def test_moe_benchmark_json_quick():
  p = subprocess.run(
    [sys.executable, os.path.join(ROOT, "benchmarks", "moe.py"), "--json", "--quick"],
    env=_env(),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert p.returncode == 0, p.stderr[-3000:]
  out = json.loads(p.stdout)  # exactly one document on stdout
  assert out["benchmark"] == "moe" and out["default_form"] == "block"
  forms = {(r["phase"], r["form"]) for r in out["rows"]}
  for phase in ("train", "decode"):
    for form in ("dense_mlp", "block", "ragged", "dense"):
      assert (phase, form) in forms
  assert all(r["seconds"] > 0 and r["ratio"] > 0 for r in out["rows"])
  assert out["default_train_ratio"] > 0


@pytest.mark.slow  # a subprocess per section: ~1 min on a loaded 2-core machine
def test_gpu_check_moe_section_smoke(tmp_path):
  out = tmp_path / "gc.json"
  p = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "benchmarks", "gpu_check.py"),
      "--smoke",
      "--sections",
      "moe",
      "--out",
      str(out),
    ],
    env=_env(),
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  res = json.loads(out.read_text())["sections"]["moe"]
  assert res["ok"], (res.get("error"), res.get("stderr_tail", "")[-2000:])
  assert {r["form"] for r in res["rows"]} == {"dense_mlp", "block", "ragged"}
