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


@pytest.mark.parametrize("with_tools", [True, False])
def test_sft_prompt_is_rls_prompt_with_the_configured_system_prompt(setup, with_tools, tmp_path):
  """Before: SFT rendered every chat with the format's default system prompt and tool block,
  ignoring ``rollout.system_prompt`` / ``with_tools`` that RL's prompts and the export use."""
  import dataclasses

  from rstar_jax.data.problems import Problem
  from rstar_jax.pipelines import wiring

  cfg, examples, tok = setup
  sp = "Solve it step by step; check arithmetic with the python tool."
  run = dataclasses.replace(
    cfg, rollout=dataclasses.replace(cfg.rollout, system_prompt=sp, with_tools=with_tools)
  )
  chat = examples[0]
  assert chat.messages[0]["role"] == "user"  # no system message of its own
  ids, mask = sft_loop.encode_example(chat, tok, **sft_loop.chat_settings(run))
  # RL's prompt builder: the runner the run config describes (issue 28 moves its builder from
  # AgentRunner.from_config to wiring.make_runner).
  if hasattr(wiring, "make_runner"):
    runner = wiring.make_runner(run, None, None, tok)
  else:
    from rstar_jax.pipelines.agent_runner import AgentRunner

    runner = AgentRunner.from_config(run, None, None, tok)
  rl_prompt = runner.prompt_ids(Problem(problem=chat.messages[0]["content"], answer="0"))
  assert ids[: len(rl_prompt)] == rl_prompt and not any(mask[: len(rl_prompt)])
  head = tok.decode(ids[: len(rl_prompt)])
  assert head.startswith(f"<|im_start|>system\n{sp}")
  assert ("<tools>" in head) == with_tools
  # The run's SFT data is rendered so: run_sft encodes with these settings.
  seen = {}
  real = sft_loop.encode_all

  def spy(examples, tokenizer, max_seq_len, **render):
    seen.update(render)
    return real(examples, tokenizer, max_seq_len, **render)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(sft_loop, "encode_all", spy)
    mp.setattr(sft_loop.wiring, "build_learner", _stop)  # the rendering is all this needs
    with pytest.raises(_Stop):
      sft_loop.run_sft(run, str(tmp_path), tokenizer=tok, examples=examples[:2])
  assert seen == sft_loop.chat_settings(run)


def test_default_system_prompt_renders_as_before(setup):
  """At the default ``rollout.system_prompt`` ('') and ``with_tools`` (True) the SFT data is
  unchanged: the format's own system prompt and tool block, as `render_chat_ids` gives them."""
  cfg, examples, tok = setup
  assert cfg.rollout.system_prompt == "" and cfg.rollout.with_tools
  for ex in examples[:3]:
    old = chat_format.render_chat_ids(tok, list(ex.messages), fmt=None)
    ids, mask = sft_loop.encode_example(ex, tok, **sft_loop.chat_settings(cfg))
    assert (ids, mask) == (old.input_ids, old.full_loss_mask)


class _Stop(Exception):
  pass


def _stop(*a, **k):
  raise _Stop


def test_encode_all_drops_what_it_cannot_train_on_and_says_how_many(caplog):
  """An item longer than ``max_seq_len`` and one with no trained token are dropped (never
  truncated), the rest kept in order, and one warning counts both kinds."""
  items = [([1, 2, 3], [0, 1, 1]), ([4] * 9, [1] * 9), ([5, 6], [0, 0]), ([7, 8], [0, 1])]
  with caplog.at_level("WARNING"):
    kept, dropped = sft_loop.encode_all(items, None, 5)
  assert kept == [([1, 2, 3], [0, 1, 1]), ([7, 8], [0, 1])] and dropped == 2
  (msg,) = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
  assert msg == (
    "SFT: dropped 2 of 4 items (1 longer than sft.max_seq_len=5, 1 without an assistant token)"
  )
