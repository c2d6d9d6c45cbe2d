"""Short real runs of every launcher on the tiny CPU config (real JaxSampler, code pool and
verifier), chained the way a user runs them: SFT -> RL (from the SFT export) -> eval of the RL
checkpoint -> HF export. Plus bad-config / bad-data errors."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs import rstar2_tiny_cpu
from rstar_jax.data.jsonl import DataError
from rstar_jax.pipelines import sft_loop
from rstar_jax.config import ConfigError, from_config_dict

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = "configs/rstar2_tiny_cpu.py"


def _launch(module, *args, timeout=400):
  env = dict(os.environ)
  env["XLA_FLAGS"] = ""          # one CPU device: the fastest layout for these toy runs
  env["JAX_PLATFORMS"] = "cpu"
  proc = subprocess.run([sys.executable, "-m", f"launchers.{module}", *args], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, f"{module} failed:\n{proc.stderr[-4000:]}"
  return proc


def test_launchers_sft_train_eval_export(tmp_path):
  small = ["--config.data.synthetic.n_train=8", "--config.data.synthetic.n_eval=2"]
  sft = _launch("sft", f"--config={TINY}:sft", f"--workdir={tmp_path}/sft",
                "--config.sft.batch_size=4", *small)
  out = json.loads(sft.stdout[sft.stdout.index("{"):])
  assert out["steps"] == out["total_steps"] == 2 and out["num_items"] == 8
  assert "[sft] 2/2" in sft.stderr                        # progress lines
  hf = out["hf_dir"]
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(hf))
  recs = [json.loads(l) for l in open(f"{tmp_path}/sft/sft_metrics.jsonl")]
  assert [r["step"] for r in recs] == [1, 2] and all(np.isfinite(r["loss"]) for r in recs)

  rl = _launch("train", f"--config={TINY}", f"--workdir={tmp_path}/rl", f"--config.model.hf_dir={hf}",
               "--max_steps=1", *small)
  out = json.loads(rl.stdout[rl.stdout.index("{"):])
  rl_updates = out["optimizer_step"]
  assert out["rl_step"] == 1 and out["stage_index"] == 0
  assert out["last_metrics"]["num_trajectories"] == 2 * 4
  assert "[step 1 rollouts] 8/8" in rl.stderr
  assert os.path.isdir(f"{tmp_path}/rl/tb") and os.path.isfile(f"{tmp_path}/rl/metrics.jsonl")

  ev = _launch("eval", f"--config={TINY}:eval", f"--config.model.hf_dir={hf}",
               f"--checkpoint_dir={tmp_path}/rl/ckpt", f"--out={tmp_path}/eval.json",
               "--config.eval.max_problems=2", *small)
  report = json.load(open(f"{tmp_path}/eval.json"))
  m = report["metrics"]
  assert m["num_problems"] == 2 and m["k"] == 1
  for key in ("accuracy", "response_length_mean", "tool_calls_per_traj", "truncation_rate"):
    assert 0.0 <= m[key] and np.isfinite(m[key]), key
  assert len(report["per_problem"]) == 2
  assert json.loads(ev.stdout[ev.stdout.index("{"):])["num_problems"] == 2

  _launch("export_hf", f"--config={TINY}", f"--config.model.hf_dir={hf}",
          f"--checkpoint_dir={tmp_path}/rl/ckpt", f"--out_dir={tmp_path}/export")
  import jax
  from rstar_jax.models import qwen3
  exported = qwen3.load_hf_params(f"{tmp_path}/export")
  sft_params = qwen3.load_hf_params(hf)
  assert os.path.isfile(f"{tmp_path}/export/tokenizer.json")
  # The exported model is the RL checkpoint: the SFT model plus the RL updates, if any (a
  # tiny SFT model usually gets every answer wrong, so its only group is dropped: no update).
  diffs = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()),
                       exported, sft_params)
  assert (max(jax.tree.leaves(diffs)) > 0) == (rl_updates > 0)


def test_bad_config_value_is_named(tmp_path):
  cfg = rstar2_tiny_cpu.get_config("sft")
  cfg.sft.batch_size = 0
  with pytest.raises(ConfigError, match=r"config.sft.batch_size: expected an int >= 1, got 0"):
    sft_loop.run_sft(from_config_dict(cfg), str(tmp_path))


def test_bad_sft_data_line_is_named(tmp_path):
  path = tmp_path / "chats.jsonl"
  good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
  bad = {"messages": [{"role": "user", "content": "q"}, {"role": "robot", "content": "a"}]}
  path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
  cfg = rstar2_tiny_cpu.get_config("sft")
  cfg.data.sft_path = str(path)
  with pytest.raises(DataError, match=r"chats.jsonl:2: field 'messages\[1\].role'"):
    sft_loop.run_sft(from_config_dict(cfg, check_paths=True), str(tmp_path / "w"))


def test_missing_problem_file_is_named(tmp_path):
  from rstar_jax.pipelines import rl_loop
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.data.train_path = str(tmp_path / "missing.jsonl")
  with pytest.raises(ConfigError, match=r"config.data.train_path: expected an existing file"):
    rl_loop.run_rl(from_config_dict(cfg, check_paths=True), str(tmp_path / "w"))
