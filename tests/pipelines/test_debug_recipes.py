"""The real recipes' ``:debug`` variants (issue 29 row 9): one step on one CPU against a local
transformers-built checkpoint, with the recipe's own chat format, tool loop and losses. Before,
that took ~10 command-line overrides (mesh, engine, micro-batches, budgets, batch sizes, eval
protocol)."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from configs import aster_qwen3_4b, rstar2_qwen3_14b
from rstar_jax.config import from_config_dict
from rstar_jax.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = {"rstar2_qwen3_14b": rstar2_qwen3_14b, "aster_qwen3_4b": aster_qwen3_4b}


@pytest.mark.parametrize("name", sorted(RECIPES))
@pytest.mark.parametrize(
  "variant,mode", [("debug", "rl"), ("sft_debug", "sft"), ("eval_debug", "eval")]
)
def test_debug_variant_sets_the_cpu_settings_and_keeps_the_recipe(name, variant, mode):
  recipe = RECIPES[name]
  real = from_config_dict(recipe.get_config(mode), check_inputs=False)
  run = from_config_dict(recipe.get_config(variant), check_inputs=False)
  assert run.mode == mode
  assert run.mesh.num_devices == 1 and (run.mesh.tensor, run.mesh.data) == (1, 1)
  assert run.rollout.engine == "jax" and run.model.dtype == "float32"
  assert run.train.micro_batches == 1 and run.train.batch_prompts == 2
  assert run.eval.protocol == "" and run.eval.k == 1 and run.eval.max_problems == 2
  assert run.data.train_path == "" and run.data.synthetic is not None
  if mode == "rl":
    assert len(run.stages) == 1 and run.stages[0].steps == 1
  # What the recipe is about stays the recipe's.
  assert run.rollout.chat_format == real.rollout.chat_format
  assert run.optim == real.optim and run.tool.num_workers == 2
  assert dataclasses.replace(run.tool, num_workers=real.tool.num_workers) == real.tool
  assert (run.rl.policy_loss, run.rl.roc_mode, run.rl.tis_cap) == (
    real.rl.policy_loss,
    real.rl.roc_mode,
    real.rl.tis_cap,
  )
  assert run.model.hf_dir == real.model.hf_dir  # the user gives --config.model.hf_dir


def test_unknown_variant_lists_the_debug_ones():
  with pytest.raises(UserError, match=r"unknown variant 'dbug'; expected one of .*'debug'"):
    rstar2_qwen3_14b.get_config("dbug")


def _tiny_qwen3_dir(path) -> str:
  """A transformers-built random Qwen3 with a ChatML tokenizer (as a user's local model dir)."""
  import torch
  import transformers

  from rstar_jax.tokenization.bpe import train_bpe_tokenizer

  tok = train_bpe_tokenizer(["Compute 7 * 8. print(7 * 8) \\boxed{56}"] * 20, 400, str(path))
  torch.manual_seed(0)
  cfg = transformers.Qwen3Config(
    vocab_size=512,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
    eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
  )
  transformers.Qwen3ForCausalLM(cfg).save_pretrained(str(path))
  return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_debug_variant_runs_one_step_on_a_local_checkpoint(tmp_path, name):
  pytest.importorskip("torch")
  model = _tiny_qwen3_dir(tmp_path / "model")
  w = tmp_path / "run"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "launchers.train",
      f"--config=configs/{name}.py:debug",
      f"--config.model.hf_dir={model}",
      f"--workdir={w}",
    ],
    cwd=REPO,
    env=dict(os.environ, XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""), JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  rows = [json.loads(line) for line in open(w / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [1]
  assert rows[0]["rollouts_generated"] == 2 * 2 * (2 if name == "rstar2_qwen3_14b" else 1)
  assert os.path.isdir(w / "ckpt") and any(n.isdigit() for n in os.listdir(w / "ckpt"))


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_sft_debug_items_fit_the_readme_tiny_tokenizer(tmp_path, name):
  """Issue 43 row 1: ``:sft_debug`` with the README's tiny Qwen3 (its small BPE tokenizer
  renders the recipe's chat template, tool block and system prompt in ~1,900 tokens) kept no
  item at max_seq_len=512. Every synthetic chat must fit the variant's own setting."""
  from rstar_jax.pipelines import data_sources, sft_loop
  from rstar_jax.tokenization.bpe import train_bpe_tokenizer

  tok = train_bpe_tokenizer(["Compute 7 * 8. print(7 * 8) \\boxed{56}"] * 20, 400, str(tmp_path))
  run = from_config_dict(RECIPES[name].get_config("sft_debug"), check_inputs=False)
  examples = data_sources.sft_examples(run)
  seqs, dropped = sft_loop.encode_all(
    examples, tok, run.sft.max_seq_len, **sft_loop.chat_settings(run)
  )
  assert dropped == 0 and len(seqs) == len(examples) > 0


def test_no_usable_sft_items_is_one_line_naming_the_setting(tmp_path, caplog):
  from rstar_jax.pipelines import data_sources, sft_loop
  from rstar_jax.tokenization.bpe import train_bpe_tokenizer

  tok = train_bpe_tokenizer(["Compute 7 * 8. print(7 * 8) \\boxed{56}"] * 20, 400, str(tmp_path))
  run = from_config_dict(rstar2_qwen3_14b.get_config("sft_debug"), check_inputs=False)
  examples = data_sources.sft_examples(run)
  with pytest.raises(UserError) as e, caplog.at_level("WARNING"):
    sft_loop.encode_all(examples, tok, 512, **sft_loop.chat_settings(run))
  # The error is the one line: no "dropped 4 of 4 items" warning before it.
  assert [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()] == []
  msg = str(e.value)
  assert "\n" not in msg
  assert msg.startswith(f"SFT: no usable items among {len(examples)}: {len(examples)} longer")
  assert "sft.max_seq_len=512" in msg and "--config.sft.max_seq_len=2048 or more" in msg


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_sft_debug_variant_runs_on_the_readme_tiny_checkpoint(tmp_path, name):
  """Issue 43 row 1, as the user ran it: ``launchers.sft --config=<recipe>:sft_debug``."""
  pytest.importorskip("torch")
  model = _tiny_qwen3_dir(tmp_path / "model")
  w = tmp_path / "run"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "launchers.sft",
      f"--config=configs/{name}.py:sft_debug",
      f"--config.model.hf_dir={model}",
      f"--workdir={w}",
    ],
    cwd=REPO,
    env=dict(os.environ, XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""), JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  rows = [json.loads(line) for line in open(w / "sft_metrics.jsonl")]
  assert [r["step"] for r in rows] == [1, 2]
  assert os.path.isfile(w / "hf" / "config.json")
