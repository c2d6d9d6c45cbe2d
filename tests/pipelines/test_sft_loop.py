"""SFT loop: loss only on assistant tokens, and an interrupted + resumed run ends bit-identical
to a straight one (same batches in the same order, same optimizer state)."""

import json
import os

import jax
import numpy as np
import pytest

from configs import rstar2_tiny_cpu
from rstar_jax.config import from_config_dict
from rstar_jax.pipelines import data_sources, hf_export, sft_loop
from rstar_jax.pipelines.metrics_log import read_jsonl_metrics
from rstar_jax.tokenization import chat_format


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  cfg = rstar2_tiny_cpu.get_config("sft")
  cfg.data.synthetic.n_train = 6
  cfg.sft.epochs = 1  # 3 steps (the config's own 30 epochs are for the README)
  cfg.sft.batch_size = 2
  cfg.sft.max_seq_len = 1024
  cfg.train.checkpoint_every = 1
  cfg.mesh.num_devices = 1  # sharded steps are covered by tests/learner; keep this fast
  cfg = from_config_dict(cfg)
  examples = data_sources.sft_examples(cfg)
  tok = data_sources.ensure_tokenizer(
    cfg,
    str(tmp_path_factory.mktemp("tok")),
    data_sources.tokenizer_corpus(data_sources.train_problems(cfg), examples),
  )
  return cfg, examples, tok


def test_loss_mask_covers_exactly_the_assistant_tokens(setup):
  _, examples, tok = setup
  ids, mask = sft_loop.encode_example(examples[0], tok)
  text_trained = tok.decode([t for t, m in zip(ids, mask) if m])
  text_masked = tok.decode([t for t, m in zip(ids, mask) if not m])
  assert "I will compute this with code." in text_trained and "<tool_call>" in text_trained
  assert "\\boxed{" in text_trained and text_trained.count("<|im_end|>") == 2
  assert "This is the problem" in text_masked and "Tool call success" in text_masked
  assert "Tool call success" not in text_trained and "<|im_start|>" not in text_trained
  # The prompt equals the one the agent loop samples from.
  prompt = chat_format.prompt_ids(tok, "rstar2", examples[0].messages[0]["content"])
  assert ids[: len(prompt)] == prompt and not any(mask[: len(prompt)])


def test_resume_is_bit_identical(setup, tmp_path):
  cfg, examples, tok = setup
  straight = sft_loop.run_sft(
    cfg, str(tmp_path / "a"), tokenizer=tok, examples=examples, export=False
  )
  assert straight["steps"] == straight["total_steps"] == 3
  part = sft_loop.run_sft(
    cfg, str(tmp_path / "b"), tokenizer=tok, examples=examples, max_steps=2, export=False
  )
  assert part["steps"] == 2
  resumed = sft_loop.run_sft(cfg, str(tmp_path / "b"), tokenizer=tok, examples=examples)
  assert resumed["steps"] == 3 and "hf_dir" in resumed
  # The export carries the run's template and stop ids (an RL run from it stops the same way).
  hf = resumed["hf_dir"]
  gen = json.load(open(os.path.join(hf, "generation_config.json")))
  assert gen["eos_token_id"] == list(chat_format.stop_token_ids(tok, cfg.model.hf_dir))
  assert chat_format.stop_token_ids(tok, hf) == chat_format.stop_token_ids(tok, cfg.model.hf_dir)
  with open(os.path.join(hf, "chat_template.jinja")) as f:
    assert f.read() == hf_export.trained_chat_template(cfg)
  same = jax.tree.map(
    lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))),
    straight["learner"].state.params,
    resumed["learner"].state.params,
  )
  assert all(jax.tree.leaves(same))
  ra = read_jsonl_metrics(tmp_path / "a" / "sft_metrics.jsonl")
  rb = read_jsonl_metrics(tmp_path / "b" / "sft_metrics.jsonl")
  assert [r["step"] for r in rb] == [1, 2, 3]
  assert [r["loss"] for r in ra] == [r["loss"] for r in rb]
