"""The rStar2-Agent and ASTER presets carry the released / published recipe values
(docs/fidelity.md lists the sources); each assertion is one row of that table."""

import pytest

from configs import aster_qwen3_4b, rstar2_qwen3_14b
from rstar_jax.config import ConfigError, eval_protocols, from_config_dict
from rstar_jax.config.schema import DataConfig, EvalConfig, RLConfig, RolloutConfig, ToolConfig


def test_rstar2_released_values():
  c = rstar2_qwen3_14b.get_config("rl")
  assert c.rl.answer_mode == "released"
  assert c.rollout.chat_format == "rstar2_released"
  assert c.rollout.max_parallel_calls == 1 and c.rollout.max_turns == 5
  assert all(s["max_turns"] == 5 for s in c.stages)
  assert (c.tool.max_response_chars, c.tool.truncation) == (256, "released")
  assert c.tool.timeout_s == 4.0
  assert c.rl.dual_clip_c == 3.0 and (c.rl.eps_low, c.rl.eps_high) == (0.2, 0.28)
  assert (c.rl.group_size, c.rl.oversample, c.rl.min_pos, c.rl.min_neg) == (16, 2, 2, 2)
  assert (c.optim.lr, c.optim.warmup_steps) == (1e-6, 20)
  assert c.data.integer_answers_only and c.data.drop_overlong_prompts
  assert c.rollout.max_prompt_tokens == 2048
  assert c.eval.protocol == "released"
  run = from_config_dict(c, "rl", check_inputs=False)
  assert run.stages[2].max_turns == 5 and run.data.integer_answers_only
  assert run.step_config().tis_cap is None and run.step_config().dual_clip_c == 3.0


def test_aster_values():
  c = aster_qwen3_4b.get_config("rl")
  assert (c.train.batch_prompts, c.rl.group_size, c.rl.ppo_mini_batches) == (128, 8, 2)
  assert c.rl.tis_cap == 2.0 and c.optim.warmup_steps == 0
  assert c.rl.drop_zero_variance is False and c.rl.dual_clip_c == 10.0
  assert [(s["response_budget"], s["max_turns"]) for s in c.stages] == [(16384, 50), (30720, 50)]
  assert c.rollout.max_tool_calls == 50
  assert (c.tool.stateful, c.tool.timeout_s, c.tool.memory_limit_mb) == (True, 30.0, 1024)
  assert c.rollout.chat_format == "qwen3_thinking"
  assert c.stages[1]["data"] == "recent" and c.stages[1]["recent_steps"] >= 1
  assert (c.eval.temperature, c.eval.top_p) == (1.0, 1.0)
  # the learner step really gets the TIS cap and the off-policy loss by registry name
  run = from_config_dict(c, "rl", check_inputs=False)
  sc = run.step_config()
  assert sc.tis_cap == 2.0 and sc.off_policy_loss == "tis" and sc.dual_clip_c == 10.0
  assert run.stages[1].data == "recent" and run.stages[1].recent_steps == 135
  c.rl.off_policy_loss = "decoupled_ppo"
  assert (
    from_config_dict(c, "rl", check_inputs=False).step_config().off_policy_loss == "decoupled_ppo"
  )


def test_new_fields_are_validated():
  d = aster_qwen3_4b.get_config("rl").to_dict()  # a plain dict: ConfigDict casts types
  d["rl"]["off_policy_loss"] = "nope"
  d["rollout"]["chat_format"] = "chatml"
  d["tool"]["truncation"] = "left"
  d["eval"]["protocol"] = "avg"
  d["data"]["integer_answers_only"] = "yes"
  with pytest.raises(ConfigError) as e:
    from_config_dict(d, "rl", check_inputs=False)
  paths = {p for p, _ in e.value.problems}
  assert {
    "rl.off_policy_loss",
    "rollout.chat_format",
    "tool.truncation",
    "eval.protocol",
    "data.integer_answers_only",
  } <= paths, paths
  # cross-field rules run once the fields are well-typed
  c = aster_qwen3_4b.get_config("rl")
  c.rl.tis_cap = 0.5
  c.stages[1]["recent_steps"] = 0
  with pytest.raises(ConfigError) as e:
    from_config_dict(c, "rl", check_inputs=False)
  paths = {p for p, _ in e.value.problems}
  assert {"rl.tis_cap", "stages[1].recent_steps"} <= paths, paths


def test_defaults_leave_the_project_behaviour():
  """The new fields default to today's behaviour (TIS off, project format / truncation, no
  protocol, no integer filter, overlong prompts dropped)."""
  assert (RLConfig().tis_cap, RLConfig().off_policy_loss, RLConfig().answer_mode) == (
    0.0,
    "tis",
    "answer_tag",
  )
  assert RolloutConfig().chat_format == "rstar2" and ToolConfig().truncation == "project"
  assert (EvalConfig().protocol, EvalConfig().csv_path) == ("", "")
  assert (DataConfig().integer_answers_only, DataConfig().drop_overlong_prompts) == (False, True)
  assert set(eval_protocols.PROTOCOLS) | {""} == {"", "released", "paper_avg_at_k"}
