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
from rstar_jax.config import ConfigError, from_config_dict
from rstar_jax.data.jsonl import DataError
from rstar_jax.pipelines import sft_loop

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = "configs/rstar2_tiny_cpu.py"


def _launch(module, *args, timeout=400):
  env = dict(os.environ)
  # One CPU device, the fastest layout for these toy runs (with the tests' compile flags).
  env["XLA_FLAGS"] = os.environ.get("RSTAR_TEST_XLA_FLAGS", "")
  env["JAX_PLATFORMS"] = "cpu"
  proc = subprocess.run(
    [sys.executable, "-m", f"launchers.{module}", *args],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert proc.returncode == 0, f"{module} failed:\n{proc.stderr[-4000:]}"
  return proc


@pytest.mark.long
@pytest.mark.slow
def test_launchers_sft_train_eval_export(tmp_path):
  """The README's chain with the tiny config's own settings: SFT teaches the tool-call format,
  so RL sees mixed groups and updates the model; the export is that updated model, and
  transformers loads it with its tokenizer."""
  sft = _launch("sft", f"--config={TINY}:sft", f"--workdir={tmp_path}/sft")
  out = json.loads(sft.stdout[sft.stdout.index("{") :])
  assert out["steps"] == out["total_steps"] > 0
  assert f"[sft] {out['steps']}/{out['steps']}" in sft.stderr  # progress lines
  hf = out["hf_dir"]
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(hf))
  recs = [json.loads(l) for l in open(f"{tmp_path}/sft/sft_metrics.jsonl")]
  assert len(recs) == out["steps"] and all(np.isfinite(r["loss"]) for r in recs)
  assert recs[-1]["loss"] < 0.5 * recs[0]["loss"]  # it learned the format

  rl = _launch(
    "train", f"--config={TINY}", f"--workdir={tmp_path}/rl", f"--config.model.hf_dir={hf}"
  )
  out = json.loads(rl.stdout[rl.stdout.index("{") :])
  cfg = rstar2_tiny_cpu.get_config("rl")
  rollouts = cfg.train.batch_prompts * cfg.rl.group_size * cfg.rl.oversample
  assert out["rl_step"] == sum(s["steps"] for s in cfg.stages)
  assert f"[step 1 rollouts] {rollouts}/{rollouts}" in rl.stderr
  assert os.path.isdir(f"{tmp_path}/rl/tb")
  rows = [json.loads(l) for l in open(f"{tmp_path}/rl/metrics.jsonl")]
  # The chain trains: some group was mixed (neither all-correct nor all-wrong), so the
  # optimizer stepped. A tiny model that never gets an answer right makes this fail.
  assert any(r["mixed_frac"] > 0 for r in rows), [r["reward_mean"] for r in rows]
  updates = out["optimizer_step"]
  assert updates > 0 and updates == rows[-1]["optimizer_step"]

  ev = _launch(
    "eval",
    f"--config={TINY}:eval",
    f"--config.model.hf_dir={hf}",
    f"--checkpoint_dir={tmp_path}/rl/ckpt",
    f"--out={tmp_path}/eval.json",
    "--config.eval.max_problems=2",
  )
  report = json.load(open(f"{tmp_path}/eval.json"))
  m = report["metrics"]
  assert m["num_problems"] == 2 and m["k"] == 1
  for key in ("accuracy", "response_length_mean", "tool_calls_per_traj", "truncation_rate"):
    assert 0.0 <= m[key] and np.isfinite(m[key]), key
  assert len(report["per_problem"]) == 2
  assert json.loads(ev.stdout[ev.stdout.index("{") :])["num_problems"] == 2

  exp = _launch(
    "export_hf",
    f"--config={TINY}",
    f"--config.model.hf_dir={hf}",
    f"--checkpoint_dir={tmp_path}/rl/ckpt",
    f"--out_dir={tmp_path}/export",
  )
  assert f"exported step {updates} to" in exp.stdout
  import jax

  from rstar_jax.models import qwen3

  exported = qwen3.load_hf_params(f"{tmp_path}/export")
  sft_params = qwen3.load_hf_params(hf)
  diffs = jax.tree.map(
    lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), exported, sft_params
  )
  assert max(jax.tree.leaves(diffs)) > 0  # the RL updates are in the export
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  from rstar_jax.tokenization import chat_format

  # The README's lines: the exported template renders the training prompt, and it generates.
  tok = AutoTokenizer.from_pretrained(f"{tmp_path}/export")
  model = AutoModelForCausalLM.from_pretrained(f"{tmp_path}/export")
  chat = [{"role": "user", "content": "Compute 3 * 4."}]
  inputs = tok.apply_chat_template(
    chat, add_generation_prompt=True, return_tensors="pt", return_dict=True
  )
  prompt = inputs["input_ids"][0].tolist()
  assert prompt == chat_format.prompt_ids(tok, cfg.rollout.chat_format, "Compute 3 * 4.")
  with torch.no_grad():
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
  assert out.shape[1] > len(prompt) and out[0, : len(prompt)].tolist() == prompt
  assert model.generation_config.eos_token_id == list(chat_format.stop_token_ids(tok, hf))


def test_export_without_a_tokenizer_is_refused(tmp_path):
  """A model directory without a tokenizer cannot be loaded: say how to give one instead."""
  env = dict(os.environ, XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""), JAX_PLATFORMS="cpu")
  ckpt = tmp_path / "run" / "ckpt"
  ckpt.mkdir(parents=True)
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "launchers.export_hf",
      f"--config={TINY}",
      f"--checkpoint_dir={ckpt}",
      f"--out_dir={tmp_path}/export",
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "export_hf: no tokenizer to copy: pass --tokenizer_dir" in proc.stderr
  assert not os.path.exists(tmp_path / "export")


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
