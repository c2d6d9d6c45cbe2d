"""scripts/eval_demo_model.py (a finished demo run's model evaluated under other settings) on a
toy "finished run": a tokenizer and a random smoke-sized model exported to ``rl/hf``. The long
tier runs the script after a real MoE demo run; this checks, in seconds, that the script is the
demo's own held-out evaluation of the chosen model with the overrides applied."""

import asyncio
import json
import os
import subprocess
import sys

import jax
import pytest

from configs import demo as demo_config
from rstar_jax.config import from_config_dict
from rstar_jax.learner.checkpoint import export_hf
from rstar_jax.models import qwen3
from rstar_jax.pipelines import demo
from rstar_jax.tokenization import bpe, domain

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Two held-out problems, sampled at a temperature the smoke config does not use: the samples
# then depend on the seeds and the override.
OVERRIDES = ["--config.eval.max_problems=2", "--config.eval.temperature=0.9"]


def _script(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = os.environ.get("RSTAR_TEST_XLA_FLAGS", "")
  return subprocess.run(
    [sys.executable, "scripts/eval_demo_model.py", "--config=configs/demo.py:smoke", *args],
    cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
  )  # fmt: skip


@pytest.mark.slow  # a subprocess and two sampler compiles: ~20 CPU-s
def test_eval_demo_model_is_the_demos_evaluation_of_the_chosen_model(tmp_path):
  run = from_config_dict(demo_config.get_config("smoke"))
  _, held = demo.problems_for(run)
  w = tmp_path / "run"
  corpus = [demo._system_prompt(run)] + [p.problem for p in held] * 5
  domain.train_domain_tokenizer(corpus, 400, str(w / "tokenizer"), domain.domain_tokens())
  mc = run.model.qwen3_config()
  params = qwen3.init_params(mc, jax.random.key(3))
  export_hf(w / "rl" / "hf", mc, params)

  out = tmp_path / "report.json"
  proc = _script(f"--workdir={w}", "--model=rl", f"--out={out}", *OVERRIDES)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = json.loads(proc.stdout.strip().splitlines()[-1])
  assert line["model"] == str(w / "rl" / "hf")
  assert line["temperature"] == 0.9 and line["rollout_dtype"] == "float32"
  rep = json.loads(out.read_text())
  assert rep["line"] == line
  m = rep["metrics"]
  assert m["num_problems"] == 2 and m["accuracy"] == line["accuracy"]
  assert (m["truncation_rate"], m["tool_error_ratio"]) == (
    line["truncation_rate"],
    line["tool_error_ratio"],
  )

  # The same evaluation in this process (the demo's `_evaluate`, the overrides applied to the
  # config, the model read back from rl/hf): the same problems, samples and metrics.
  c = demo_config.get_config("smoke")
  c.eval.max_problems, c.eval.temperature = 2, 0.9
  cfg = from_config_dict(c)
  ref = asyncio.run(
    demo._evaluate(
      cfg,
      qwen3.load_hf_params(str(w / "rl" / "hf"), mc),
      bpe.load_tokenizer(str(w / "tokenizer")),
      held[:2],
      cfg.eval.k,
      cfg.eval.seed,
    )
  )
  assert [p["problem"] for p in rep["per_problem"]] == [p.problem for p in held[:2]]
  assert rep["per_problem"] == ref["per_problem"]
  assert [x["response"] for x in rep["samples"]] == [x["response"] for x in ref["samples"]]
  assert len(rep["samples"]) == 2 and all(x["response"] for x in rep["samples"])
  for key in ("accuracy", "truncation_rate", "tool_error_ratio", "response_length_mean"):
    assert m[key] == pytest.approx(ref["metrics"][key]), key
