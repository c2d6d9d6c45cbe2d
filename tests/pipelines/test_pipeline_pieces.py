"""Pure pieces of the pipelines: typed config conversion, hard subset, collapse monitor, metrics
log. No model, no engine. (The selection math is tested in tests/rl/test_rl_selection.py.)"""

import dataclasses
import json

import numpy as np
import pytest

from configs import aster_qwen3_4b, aster_tiny_cpu, common, rstar2_qwen3_14b, rstar2_tiny_cpu
from rstar_jax.config import ConfigError, RunConfig, from_config_dict, schema
from rstar_jax.learner.batch import length_bucket
from rstar_jax.pipelines import rl_metrics, stages
from rstar_jax.pipelines.metrics_log import MetricsWriter, read_jsonl_metrics
from rstar_jax.rollout.types import ToolCallRecord, Trajectory


# ----------------------------------------------------------------------------- config validation
@pytest.mark.parametrize(
  "module", [rstar2_qwen3_14b, aster_qwen3_4b, rstar2_tiny_cpu, aster_tiny_cpu]
)
@pytest.mark.parametrize("mode", ["rl", "sft", "eval"])
def test_recipe_configs_convert(module, mode):
  run = from_config_dict(module.get_config(mode))
  assert isinstance(run, RunConfig) and run.mode == mode


def test_recipe_stage_plans():
  r = rstar2_qwen3_14b.get_config("rl")
  # released trainer: 5 assistant turns in every stage (paper: 10 / 10 / 15)
  assert [(s["response_budget"], s["max_turns"], s["steps"]) for s in r.stages] == [
    (8192, 5, 300),
    (12288, 5, 85),
    (12288, 5, 125),
  ]
  assert r.stages[2]["data"] == "hard" and r.stages[2]["reset_optimizer"]
  assert r.stages[2]["drop_solved_k_of_k"] == 8
  a = aster_qwen3_4b.get_config("rl")
  assert a.rl.roc_mode == "random" and a.rollout.max_tool_calls == 50 and a.tool.stateful
  assert [s["data"] for s in a.stages] == ["full", "recent"]


def test_distributed_init_only_with_multi_process_env(monkeypatch):
  from rstar_jax.pipelines import launch

  for k in (
    "JAX_COORDINATOR_ADDRESS",
    "COORDINATOR_ADDRESS",
    "SLURM_JOB_ID",
    "SLURM_NTASKS",
    "OMPI_COMM_WORLD_SIZE",
    "JOBSET_NAME",
    "MEGASCALE_COORDINATOR_ADDRESS",
    "JAX_NUM_PROCESSES",
  ):
    monkeypatch.delenv(k, raising=False)
  assert launch.maybe_initialize_distributed() is False
  monkeypatch.setenv("SLURM_JOB_ID", "7")
  monkeypatch.setenv("SLURM_NTASKS", "1")  # a one-task job: nothing to join
  assert launch.maybe_initialize_distributed() is False


def _problems(cfg, mode="rl"):
  with pytest.raises(ConfigError) as e:
    from_config_dict(cfg, mode)
  return e.value.problems, str(e.value)


def test_bad_values_name_field_expected_and_got():
  cfg = rstar2_qwen3_14b.get_config("rl")
  cfg.rl.group_size = 0
  cfg.rl.roc_mode = "greedy"
  cfg.optim.lr = -1.0
  cfg.rollout.top_p = 1.5
  cfg.rl.neg_adv_scale = 1.5
  probs, msg = _problems(cfg)
  paths = [p for p, _ in probs]
  assert "rl.group_size" in paths and "rl.roc_mode" in paths
  assert "optim.lr" in paths and "rollout.top_p" in paths and "rl.neg_adv_scale" in paths
  assert "config.rl.roc_mode: expected one of ['paper', 'released', 'random']" in msg
  assert "got 'greedy'" in msg
  assert "config.rl.group_size: expected an int >= 1, got 0\n" in msg + "\n"


def test_typo_missing_and_stage_errors():
  cfg = rstar2_qwen3_14b.get_config("rl")
  cfg.rl.grup_size = 4  # typo: would silently keep the default
  cfg.stages[2]["drop_solved_k_of_k"] = 0  # hard stage without k
  cfg.stages[1]["steps"] = "85"
  cfg.rollut = cfg.rollout  # a misspelt section
  probs, msg = _problems(cfg)
  paths = [p for p, _ in probs]
  assert "rl.grup_size" in paths and "unknown field; did you mean 'group_size'?" in msg
  assert "rollut" in paths and "did you mean 'rollout'?" in msg
  assert "stages[2].drop_solved_k_of_k" in paths
  assert "stages[1].steps" in paths and "expected an int >= 1, got '85'" in msg
  # A field a recipe leaves out takes the dataclass default (defaults live only there).
  cfg = rstar2_qwen3_14b.get_config("rl")
  del cfg.train.batch_prompts
  assert from_config_dict(cfg).train.batch_prompts == schema.TrainConfig().batch_prompts


def test_cross_field_checks():
  cfg = rstar2_qwen3_14b.get_config("rl")
  cfg.rl.min_pos, cfg.rl.min_neg, cfg.rl.group_size = 3, 3, 4
  cfg.model.num_key_value_heads = 3
  cfg.mesh.data, cfg.mesh.fsdp = -1, -1  # two "rest" axes are ambiguous
  probs, _ = _problems(cfg)
  paths = [p for p, _ in probs]
  assert {"rl.min_pos", "model.num_key_value_heads", "mesh"} <= set(paths)


def test_missing_data_file_named(tmp_path):
  cfg = aster_qwen3_4b.get_config("sft")
  cfg.data.sft_path = str(tmp_path / "nope.jsonl")
  with pytest.raises(ConfigError, match=r"config.data.sft_path: expected an existing file"):
    from_config_dict(cfg, check_paths=True)


def test_sections_check_in_post_init_with_one_line_errors():
  with pytest.raises(ValueError) as e:
    schema.RLConfig(group_size=0)
  assert str(e.value) == "config.rl.group_size: expected an int >= 1, got 0"
  with pytest.raises(TypeError):
    schema.RLConfig(16)  # keyword-only
  rl = schema.RLConfig(eps_high=1)  # ints become floats: one representation
  assert rl.eps_high == 1.0 and isinstance(rl.eps_high, float)
  with pytest.raises(dataclasses.FrozenInstanceError):
    rl.group_size = 4
  with pytest.raises(ConfigError, match="rl.group_size: expected >= 2 for GRPO"):
    RunConfig(mode="rl", rl=schema.RLConfig(group_size=1, min_pos=0, min_neg=0))


def test_every_field_is_documented_and_recipes_start_from_the_defaults():
  for name, cls in schema.SECTIONS.items():
    for field, default, doc in schema.describe(cls):
      assert doc and "\n" not in doc and "SPEC" not in doc, (name, field)
  assert dict(common.rl_config()) == schema.defaults_dict(schema.RLConfig)
  # the rStar2 recipe leaves the defaults only where the released code differs (docs/fidelity.md)
  assert from_config_dict(rstar2_qwen3_14b.get_config("rl")).rl == dataclasses.replace(
    schema.RLConfig(), answer_mode="released", dual_clip_c=3.0
  )


def test_new_section_field_is_a_one_place_change():
  # A field added to a section dataclass is accepted from a recipe and defaults without one.
  @dataclasses.dataclass(frozen=True, kw_only=True)
  class RL2(schema.RLConfig):
    max_staleness: int = schema.field(0, schema.int_range(0), "Steps a rollout may lag.")

  old = schema.SECTIONS["rl"]
  schema.SECTIONS["rl"] = RL2
  try:
    cfg = rstar2_tiny_cpu.get_config("rl")
    assert from_config_dict(cfg).rl.max_staleness == 0
    cfg.rl.max_staleness = 2
    assert from_config_dict(cfg).rl.max_staleness == 2
    cfg.rl.max_staleness = -1
    with pytest.raises(ConfigError, match=r"config.rl.max_staleness: expected an int >= 0"):
      from_config_dict(cfg)
  finally:
    schema.SECTIONS["rl"] = old


# ----------------------------------------------------------------------------- stages
def test_build_hard_subset_drops_only_k_of_k():
  probs = ["a", "b", "c", "d", "e"]
  kept, st = stages.build_hard_subset(probs, [8, 7, 0, 5, 3], k=8, num_sampled=[8, 8, 8, 5, 8])
  # "a" solved 8/8 -> dropped; "d" solved 5/5 but only 5 samples (< k) -> kept.
  assert kept == ["b", "c", "d", "e"]
  assert st["hard_subset_dropped"] == 1 and st["hard_subset_kept"] == 4
  with pytest.raises(ValueError, match="num_correct"):
    stages.build_hard_subset(probs, [9, 0, 0, 0, 0], k=8)


def test_locate_stage():
  st = lambda name, steps, budget, turns, **kw: stages.Stage(
    name=name, steps=steps, response_budget=budget, max_turns=turns, **kw
  )
  sts = [
    st("s1", 3, 64, 2),
    st("s2", 2, 64, 2),
    st("s3", 1, 64, 3, data="hard", drop_solved_k_of_k=2),
  ]
  assert stages.locate(sts, 0) == (0, 0)
  assert stages.locate(sts, 4) == (1, 1)
  assert stages.locate(sts, 5) == (2, 0)
  assert stages.locate(sts, 6) == (3, 0)
  with pytest.raises(ValueError, match="drop_solved_k_of_k"):
    st("bad", 1, 64, 2, data="hard")


# ----------------------------------------------------------------------------- collapse monitor
def test_collapse_monitor_warns_on_sustained_fall_only(caplog):
  m = rl_metrics.CollapseMonitor(window=3, ratio=0.8)
  assert not any(m.update(x) for x in [5.0, 5.2, 4.9, 5.1])  # noisy, no trend
  fired = [m.update(x) for x in [4.5, 4.0, 3.0]]  # 5.1 -> 3.0 falling 3 steps
  assert fired == [False, False, True]
  assert "interaction collapse" in caplog.text
  m2 = rl_metrics.CollapseMonitor(window=3, ratio=0.5)
  assert not any(m2.update(x) for x in [5.0, 4.9, 4.8, 4.7])  # falling but only 6%
  s = m.state_dict()
  m3 = rl_metrics.CollapseMonitor(window=3, ratio=0.8)
  m3.load_state_dict(json.loads(json.dumps(s)))
  assert m3.history == m.history


def test_length_bucket():
  assert length_bucket(1) == 64 and length_bucket(64) == 64 and length_bucket(65) == 128
  assert length_bucket(300, 16) == 512


# ----------------------------------------------------------------------------- metrics
def _traj(reward_calls, n_resp=10, finish="stop", tags=1, turns=2):
  calls = [ToolCallRecord(status=s, duration_s=0.1, code="", output_text="") for s in reward_calls]
  return Trajectory(
    prompt_ids=[1, 2],
    response_ids=list(range(n_resp)),
    loss_mask=[1] * n_resp,
    logprobs=[0.0] * n_resp,
    weight_versions=[0] * n_resp,
    num_turns=turns,
    tool_calls=calls,
    finish_reason=finish,
    num_answer_tags=tags,
  )


def test_trajectory_metrics_values():
  trajs = [
    _traj(["ok", "error"]),
    _traj(["ok"]),
    _traj([], finish="length", tags=0),
    _traj(["timeout", "ok", "ok", "ok"]),
  ]
  m = rl_metrics.trajectory_metrics(trajs, [1, 1, 0, 0])
  assert m["tool_calls_per_traj"] == pytest.approx(7 / 4)
  assert m["pos_tool_error_ratio"] == pytest.approx(1 / 3)  # positives: ok,error,ok
  assert m["tool_error_ratio"] == pytest.approx(2 / 7)
  assert m["truncation_ratio"] == pytest.approx(0.25)
  assert m["answer_tags_0_frac"] == pytest.approx(0.25)
  assert "prefill_tokens_per_traj" not in m  # no engine count on these trajectories
  counted = [dataclasses.replace(t, prefill_tokens=n) for t, n in zip(trajs, (10, 20, 30, 40))]
  m = rl_metrics.trajectory_metrics(counted, [1, 1, 0, 0], prefix="kept_")
  assert m["kept_prefill_tokens_per_traj"] == pytest.approx(25.0)
  partly = [counted[0], trajs[1]]  # one unknown: no figure rather than a wrong one
  assert "prefill_tokens_per_traj" not in rl_metrics.trajectory_metrics(partly, [1, 0])
  g = rl_metrics.group_outcome_metrics(np.array([[1, 1], [0, 0], [1, 0]]))
  assert g["all_correct_frac"] == pytest.approx(1 / 3) and g["all_wrong_frac"] == pytest.approx(
    1 / 3
  )


def test_metrics_writer_resume_drops_later_records(tmp_path):
  with MetricsWriter(tmp_path, tensorboard=False) as w:
    for s in range(1, 6):
      w.write(s, {"x": float(s), "arr": np.float32(2.5)})
  with MetricsWriter(tmp_path, resume_step=3, tensorboard=False) as w:
    w.write(4, {"x": 40.0})
  recs = read_jsonl_metrics(tmp_path / "metrics.jsonl")
  assert [r["step"] for r in recs] == [1, 2, 3, 4] and recs[-1]["x"] == 40.0
  assert recs[0]["arr"] == 2.5


# ----------------------------------------------------------------------------- cold start
def _chat(answer_written, gold, statuses):
  from rstar_jax.data.sft_data import ChatExample

  msgs = [{"role": "user", "content": "q"}]
  for s in statuses:
    msgs.append(
      {
        "role": "assistant",
        "content": "call",
        "tool_calls": [
          {
            "function": {
              "name": "execute_python_code_with_standard_io",
              "arguments": {"code": "print(1)", "input": ""},
            }
          }
        ],
      }
    )
    msgs.append({"role": "tool", "content": f"Tool call {s}\nstdout: 1"})
  msgs.append(
    {"role": "assistant", "content": f"</reason><answer>\\boxed{{{answer_written}}}</answer>"}
  )
  return ChatExample(messages=tuple(msgs), extra={"answer": gold})


def test_select_interaction_dense():
  from rstar_jax.pipelines.data_sources import select_interaction_dense

  chats = [
    _chat(5, 5, ["success"] * 3),  # kept (3 calls)
    _chat(5, 6, ["success"] * 4),  # wrong answer
    _chat(7, 7, ["success", "failure"]),  # a failed call
    _chat(8, 8, ["success"]),  # too sparse
    _chat(9, 9, ["success"] * 5),
  ]  # kept (5 calls, densest)
  kept, st = select_interaction_dense(chats, min_tool_calls=2)
  assert [c.extra["answer"] for c in kept] == [5, 9]
  assert (st["dropped_incorrect"], st["dropped_failed_call"], st["dropped_sparse"]) == (1, 1, 1)
  kept, st = select_interaction_dense(chats, min_tool_calls=2, max_trajectories=1)
  assert [c.extra["answer"] for c in kept] == [9] and st["mean_tool_calls_kept"] == 5
  kept, _ = select_interaction_dense(chats, min_tool_calls=1, require_all_calls_ok=False)
  assert [c.extra["answer"] for c in kept] == [5, 7, 8, 9]


def test_synthetic_difficulty_from_config_dict():
  import ml_collections

  from rstar_jax.pipelines import data_sources

  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.data.synthetic = ml_collections.ConfigDict(
    dict(
      seed=1,
      n_train=30,
      n_eval=10,
      families=["mulmod"],
      difficulty=ml_collections.ConfigDict(dict(operand_digits=2, modulus_digits=2)),
    )
  )
  cfg.eval.max_problems = 0
  run = from_config_dict(cfg)
  train = data_sources.train_problems(run)
  held = data_sources.eval_problems(run)
  assert len(train) == 30 and len(held) == 10
  # Every operand of "Compute (A * B) mod M." has two digits, as the custom preset says.
  for p in train + held:
    nums = [int(t.strip("().")) for t in p.problem.split() if t.strip("().").isdigit()]
    assert len(nums) == 3 and all(10 <= n <= 99 for n in nums), p.problem
  cfg.data.synthetic.difficulty = ml_collections.ConfigDict(dict(operand_digit=2))
  with pytest.raises(
    ConfigError,
    match=r"config.data.synthetic.difficulty.operand_digit: "
    r"unknown field; did you mean 'operand_digits'",
  ):
    from_config_dict(cfg)
  cfg.data.synthetic.difficulty = ml_collections.ConfigDict(dict(operand_digits=0))
  with pytest.raises(ConfigError, match="config.data.synthetic.difficulty: .*operand_digits"):
    from_config_dict(cfg)
