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


@pytest.mark.long
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


def _base_python_without_jax():
  """The interpreter the venv was made from: a `python3` without the project's packages, as
  on the machine of issue 43 row 5 (skipped where it has jax)."""
  base = os.path.join(sys.base_prefix, "bin", "python3")
  if not os.path.isfile(base):
    pytest.skip("no base interpreter here")
  if subprocess.run([base, "-c", "import jax"], capture_output=True).returncode == 0:
    pytest.skip("the base interpreter has jax")
  return base


def _env_section(tmp_path, env):
  out = tmp_path / "gc.json"
  p = subprocess.run(
    ["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), "--smoke", "--sections", "env"]
    + ["--out", str(out)],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  return p, json.loads(out.read_text())


def test_a_failed_section_is_a_nonzero_exit(tmp_path):
  """Issue 43 row 5: every section ``ModuleNotFoundError: No module named 'jax'``, exit 0."""
  env = dict(os.environ, PYTHON=_base_python_without_jax())
  p, report = _env_section(tmp_path, env)
  assert not report["sections"]["env"]["ok"]
  assert p.returncode == 1, p.stdout[-2000:]
  assert "[gpu_check] FAILED sections: env" in p.stdout


def test_the_projects_venv_is_the_default_interpreter(tmp_path):
  """As its header shows (no PYTHON): the repo's .venv, not the first python3 on PATH."""
  if not os.access(os.path.join(ROOT, ".venv", "bin", "python"), os.X_OK):
    pytest.skip("no .venv in this checkout")
  shim = tmp_path / "bin"
  shim.mkdir()
  (shim / "python3").symlink_to(_base_python_without_jax())
  env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
  env["PATH"] = f"{shim}{os.pathsep}{env.get('PATH', '')}"
  p, report = _env_section(tmp_path, env)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
  assert report["sections"]["env"]["ok"] and report["sections"]["env"]["jax"]
