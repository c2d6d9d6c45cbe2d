"""configs/rstar2_qwen3_30b_a3b.py (issue 39 item 4): the rStar2 recipe on Qwen3-30B-A3B with
an expert-parallel mesh and routing replay, and its ``:debug`` / ``:sft_debug`` /
``:eval_debug`` variants running one step on one CPU against a transformers-built tiny
Qwen3-MoE (as tests/pipelines/test_debug_recipes.py does for the dense recipes)."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs import rstar2_qwen3_14b, rstar2_qwen3_30b_a3b
from rstar_jax.config import from_config_dict

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("mode", ["rl", "sft"])
def test_recipe_is_the_14b_recipe_on_the_moe_model(mode):
  run = from_config_dict(rstar2_qwen3_30b_a3b.get_config(mode), check_inputs=False)
  dense = from_config_dict(rstar2_qwen3_14b.get_config(mode), check_inputs=False)
  assert run.model.hf_dir.endswith("Qwen3-30B-A3B-Base") and run.plan.model_preset == (
    "qwen3-30b-a3b"
  )
  assert (run.mesh.expert, run.mesh.fsdp, run.mesh.data, run.mesh.tensor) == (8, 8, 1, 1)
  assert run.rl.routing_replay == "rollout"
  # Everything the paper / released code fixes is the 14B recipe's.
  for section in ("optim", "tool", "reward", "eval", "data", "sft"):
    assert getattr(run, section) == getattr(dense, section), section
  assert run.stages == dense.stages
  assert dataclasses.replace(run.rl, routing_replay="off") == dense.rl
  assert run.rollout == dense.rollout and run.train == dense.train
  assert dataclasses.replace(run.model, hf_dir=dense.model.hf_dir) == dense.model


@pytest.mark.parametrize(
  "variant,mode", [("debug", "rl"), ("sft_debug", "sft"), ("eval_debug", "eval")]
)
def test_debug_variants_run_on_one_cpu_and_keep_the_recipe(variant, mode):
  real = from_config_dict(rstar2_qwen3_30b_a3b.get_config(mode), check_inputs=False)
  run = from_config_dict(rstar2_qwen3_30b_a3b.get_config(variant), check_inputs=False)
  assert run.mode == mode and run.mesh.num_devices == 1 and run.mesh.expert == 1
  assert run.rollout.engine == "jax" and run.model.dtype == "float32"
  assert run.rl.routing_replay == real.rl.routing_replay == "rollout"
  assert run.rollout.chat_format == real.rollout.chat_format and run.optim == real.optim
  assert run.model.hf_dir == real.model.hf_dir  # the user gives --config.model.hf_dir


def _tiny_qwen3_moe_dir(path) -> str:
  """A transformers-built random Qwen3-MoE (mixed dense / sparse layers) with a ChatML
  tokenizer, as a user's local model directory."""
  import torch
  import transformers

  from rstar_jax.tokenization.bpe import train_bpe_tokenizer

  tok = train_bpe_tokenizer(["Compute 7 * 8. print(7 * 8) \\boxed{56}"] * 20, 400, str(path))
  torch.manual_seed(0)
  cfg = transformers.Qwen3MoeConfig(
    vocab_size=512,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_experts=4,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    mlp_only_layers=[1],
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
    eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
  )
  transformers.Qwen3MoeForCausalLM(cfg).save_pretrained(str(path))
  return str(path)


def _run(args, tmp_path):
  proc = subprocess.run(
    [sys.executable, "-m", *args],
    cwd=REPO,
    env=dict(os.environ, XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""), JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
  pytest.importorskip("torch")
  return _tiny_qwen3_moe_dir(tmp_path_factory.mktemp("tiny_moe"))


@pytest.mark.slow  # one RL step with the tool loop and routing replay (~2-4 min loaded)
def test_debug_runs_one_rl_step_with_routing_replay(tiny_moe, tmp_path):
  w = tmp_path / "run"
  cfg = "configs/rstar2_qwen3_30b_a3b.py:debug"
  _run(
    ["launchers.train", f"--config={cfg}", f"--config.model.hf_dir={tiny_moe}", f"--workdir={w}"],
    tmp_path,
  )
  rows = [json.loads(line) for line in open(w / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [1]
  assert rows[0]["rollouts_generated"] == 2 * 2 * 2
  assert any(n.isdigit() for n in os.listdir(w / "ckpt"))


@pytest.mark.slow  # one SFT step (~1-2 min loaded)
def test_sft_debug_runs_one_step(tiny_moe, tmp_path):
  w = tmp_path / "sft"
  cfg = "configs/rstar2_qwen3_30b_a3b.py:sft_debug"
  _run(
    [
      "launchers.sft",
      f"--config={cfg}",
      f"--config.model.hf_dir={tiny_moe}",
      f"--workdir={w}",
      "--max_steps=1",
      # The tiny byte-level tokenizer makes the synthetic items longer than the overlay's 512.
      "--config.sft.max_seq_len=2048",
    ],
    tmp_path,
  )
  rows = [json.loads(line) for line in open(w / "sft_metrics.jsonl")]
  assert len(rows) == 1 and np.isfinite(rows[0]["loss"]), rows
  # The MoE learner ran: the router's load-balancing loss joined the step.
  assert rows[0]["moe/load_balancing_loss"] > 0, sorted(rows[0])


@pytest.mark.slow  # a 2-problem eval with the JaxSampler on the MoE model (~1-2 min loaded)
def test_eval_debug_runs(tiny_moe, tmp_path):
  out = tmp_path / "eval.json"
  cfg = "configs/rstar2_qwen3_30b_a3b.py:eval_debug"
  _run(
    ["launchers.eval", f"--config={cfg}", f"--config.model.hf_dir={tiny_moe}", f"--out={out}"],
    tmp_path,
  )
  report = json.load(open(out))
  assert report["metrics"]
