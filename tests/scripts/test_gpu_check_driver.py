"""benchmarks/gpu_check.py's driver with its section processes stood in for (issue 38 item 4: a
section that dies without a result or runs out of time was reached only when the long tier's
every-section run failed), and its FLOPs count against the model's own parameter layout."""

import importlib.util
import json
import math
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load():
  spec = importlib.util.spec_from_file_location(
    "gpu_check_driver", os.path.join(REPO, "benchmarks", "gpu_check.py")
  )
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


gc = _load()


def test_train_flops_counts_every_kernel_and_the_causal_attention():
  import jax

  from rstar_jax.models import qwen3

  dims = gc.TINY
  shapes = jax.tree_util.tree_flatten_with_path(
    qwen3.param_shapes(qwen3.Qwen3Config(**dims)), is_leaf=lambda x: isinstance(x, tuple)
  )[0]
  # Matmul weights: every kernel and the (tied) embedding; norms do no matmul.
  m = sum(math.prod(s) for path, s in shapes if path[-1].key in ("kernel", "embedding"))
  L, hq, dh = dims["num_hidden_layers"], dims["num_attention_heads"], dims["head_dim"]
  for rows, seq in ((1, 1), (2, 64), (3, 100)):
    # 6 x params x tokens, plus QK^T and PV over the lower triangle (x 3 with the backward).
    want = 6 * rows * seq * m + 6 * rows * L * hq * dh * seq * seq
    assert gc.train_flops(dims, rows, seq) == pytest.approx(want, rel=1e-12)
  assert gc.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0 and gc.peak_tflops("cpu") is None


def test_a_section_without_a_result_or_out_of_time_fails_the_run_and_keeps_the_rest(
  tmp_path, monkeypatch, capsys
):
  calls = []

  def fake_run(cmd, cwd, env, capture_output, text, timeout):
    name = cmd[cmd.index("--section") + 1]
    calls.append((name, timeout, env["JAX_PLATFORMS"], "--smoke" in cmd))
    if name == "env":  # crashed before printing its result
      return subprocess.CompletedProcess(cmd, -11, "starting\n", "Segmentation fault")
    if name == "learner":
      raise subprocess.TimeoutExpired(cmd, timeout, output=b"", stderr=b"compiling ...")
    if name == "dlpack":  # a result line, then more output
      res = {"ok": True, "zero_copy": True}
      return subprocess.CompletedProcess(cmd, 0, f"GPU_CHECK_RESULT {json.dumps(res)}\nbye\n", "")
    res = {"ok": False, "error": "ValueError: no device"}
    return subprocess.CompletedProcess(cmd, 0, f"GPU_CHECK_RESULT {json.dumps(res)}\n", "warn")

  monkeypatch.setattr(gc.subprocess, "run", fake_run)
  out = tmp_path / "r" / "gc.json"
  rc = gc.main(["--smoke", "--sections", "env,learner,dlpack,rl_loop", "--out", str(out)])
  assert rc == 1
  assert calls == [
    (n, gc.SMOKE_BUDGET[n], "cpu", True) for n in ("env", "learner", "dlpack", "rl_loop")
  ]
  s = json.loads(out.read_text())["sections"]
  assert s["env"]["error"] == "section process exited -11 without a result"
  assert s["env"]["stderr_tail"] == "Segmentation fault"
  assert s["learner"] == {
    "ok": False,
    "error": f"timed out after {gc.SMOKE_BUDGET['learner']} s",
    "stderr_tail": "compiling ...",
    "wall_s": s["learner"]["wall_s"],
  }
  assert s["dlpack"]["ok"] and s["dlpack"]["zero_copy"] and "stderr_tail" not in s["dlpack"]
  assert s["rl_loop"]["error"] == "ValueError: no device" and s["rl_loop"]["stderr_tail"] == "warn"
  assert "[gpu_check] FAILED sections: env, learner, rl_loop" in capsys.readouterr().out


def test_an_unknown_section_is_one_line(tmp_path, monkeypatch):
  monkeypatch.setattr(gc.subprocess, "run", None)  # no section may start
  with pytest.raises(SystemExit, match="--sections: unknown section 'gpu'; choose from"):
    gc.main(["--smoke", "--sections", "env,gpu", "--out", str(tmp_path / "x.json")])
