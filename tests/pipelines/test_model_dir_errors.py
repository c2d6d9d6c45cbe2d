"""Issue 43 row 8: ``--config.model.hf_dir`` naming a model directory without a tokenizer.
Before: a 30-line traceback ending in ``FileNotFoundError: load_tokenizer: ...``, rc 1. Now:
one line naming the field, the directory and the setting to use, rc 2, before any work."""

import json
import os
import subprocess
import sys

import pytest

from rstar_jax.errors import UserError
from rstar_jax.tokenization import bpe

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _model_without_tokenizer(path):
  path.mkdir()
  cfg = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 512,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
  }
  (path / "config.json").write_text(json.dumps(cfg))
  return path


@pytest.mark.parametrize("launcher", ["train", "sft"])
def test_model_dir_without_a_tokenizer_is_one_line(tmp_path, launcher):
  model = _model_without_tokenizer(tmp_path / "model")
  variant = "debug" if launcher == "train" else "sft_debug"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      f"launchers.{launcher}",
      f"--config=configs/rstar2_qwen3_14b.py:{variant}",
      f"--config.model.hf_dir={model}",
      f"--workdir={tmp_path / 'run'}",
    ],
    cwd=REPO,
    env=dict(os.environ, XLA_FLAGS=os.environ.get("RSTAR_TEST_XLA_FLAGS", ""), JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1, proc.stderr[-3000:]
  assert lines[0].endswith(
    f"config.model.hf_dir: '{model}' holds no tokenizer (expected tokenizer.json or "
    "tokenizer_config.json); copy the model's tokenizer files there, or name a directory "
    "that has them with --config.model.tokenizer_dir=DIR"
  )


def test_load_tokenizer_of_a_directory_without_one_is_a_user_error(tmp_path):
  with pytest.raises(UserError, match="holds no tokenizer.json"):
    bpe.load_tokenizer(str(tmp_path))


def test_start_up_line_names_reward_verifier_lora_and_chat_format():
  """Issue 43 row 14: a custom reward and LoRA were invisible at start."""
  from configs import aster_qwen3_4b, demo
  from rstar_jax.config import from_config_dict
  from rstar_jax.pipelines import launch

  cfg = demo.get_config("lora_smoke")
  cfg.reward.verifier = "math_verify_text"
  line = launch.run_line(from_config_dict(cfg, "rl"), "launchers.demo")
  assert line.startswith("launchers.demo: model from scratch (config.model); chat format ")
  assert "reward 'math' (verifier 'math_verify_text'); LoRA rank 16, alpha 32;" in line
  run = from_config_dict(aster_qwen3_4b.get_config("sft_debug"), check_inputs=False)
  line = launch.run_line(run, "launchers.sft")
  assert "chat format 'qwen3_thinking'" in line and "reward" not in line
