"""The demo's report phase and its SFT reuse without the training runs: what the long tier's MoE,
transport and LoRA demo runs reach at the end of a run, checked on files written here
(milliseconds each)."""

import json
import os

import numpy as np
import pytest

from configs import demo as demo_config
from rstar_jax.config import from_config_dict
from rstar_jax.pipelines import demo


def _eval_report(acc):
  keys = ("tool_calls_per_traj", "tool_error_ratio", "pos_tool_error_ratio")
  m = {"accuracy": acc, "num_problems": 6, "k": 1, "response_length_mean": 40.0}
  return {"metrics": {**m, **dict.fromkeys(keys, 0.5)}}


def _finished_run(w, rows):
  os.makedirs(os.path.join(w, "rl"), exist_ok=True)
  for name, acc in (("sft", 0.25), ("rl", 0.5)):
    with open(os.path.join(w, f"eval_{name}.json"), "w") as f:
      json.dump(_eval_report(acc), f)
  with open(os.path.join(w, "rl", "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


def test_a_moe_runs_summary_carries_its_routing_and_the_eval_curve(tmp_path):
  """A run whose steps logged ``routing/*`` metrics (a MoE demo with the engine's routes): the
  summary names the replay mode, summarises each metric and keeps the in-loop eval curve; a
  dense run's summary has none of the three."""
  rows = [
    {"step": 1, "reward_mean": 0.1, "eval_accuracy": 0.2, "routing/agree": 0.5},
    {"step": 2, "reward_mean": 0.3, "routing/agree": 0.7, "routing/replay/is_ratio_min": 0.8},
    {"step": 3, "reward_mean": 0.2, "eval_accuracy": 0.4, "routing/replay/is_ratio_min": 0.6},
  ]
  w = str(tmp_path / "moe")
  _finished_run(w, rows)
  moe = from_config_dict(demo_config.get_config("moe_smoke"))
  s = demo.build_summary(w, 12.0, moe)
  assert s["routing_replay"] == moe.rl.routing_replay == "off"
  assert s["routing"]["agree"] == pytest.approx({"first": 0.5, "last": 0.7, "mean": 0.6})
  assert s["routing"]["replay/is_ratio_min"]["min"] == 0.6
  assert s["eval_curve"] == [[1, 0.2], [3, 0.4]]
  assert s["accuracy_gain"] == 0.25 and s["rl_steps"] == 3 and s["reward"]["last"] == 0.2

  w = str(tmp_path / "dense")
  _finished_run(w, [{k: v for k, v in r.items() if not k.startswith("routing/")} for r in rows])
  dense = demo.build_summary(w, 12.0, from_config_dict(demo_config.get_config("smoke")))
  assert not {"routing_replay", "routing", "eval_curve"} & set(dense)


def test_routing_summary_keeps_the_minimum_and_skips_a_metric_never_logged():
  got = demo.routing_summary(
    [
      {"step": 1, "routing/no_replay/is_ratio_min": 0.9, "routing/agree": None},
      {"step": 2, "routing/no_replay/is_ratio_min": 0.7, "routing/agree": None},
    ]
  )
  assert got == {
    "no_replay/is_ratio_min": pytest.approx({"first": 0.9, "last": 0.7, "mean": 0.8, "min": 0.7})
  }


def test_a_run_reusing_an_sft_model_copies_it_first_and_reports_without_a_plot(
  tmp_path, monkeypatch
):
  """``demo.reuse_sft_from`` with ``demo.plot`` off (the transport runs): the first run's SFT
  side is copied before any phase runs, the phases after it write the summary, and no plot is
  drawn (matplotlib not imported for it)."""
  from rstar_jax.pipelines import demo_record

  src, w = tmp_path / "first", tmp_path / "second"
  # The first run's records (what its phases ran with), then its SFT side's outputs.
  demo_record.check_demo(from_config_dict(demo_config.get_config("smoke")), str(src))
  for d in ("tokenizer", os.path.join("sft", "hf")):
    (src / d).mkdir(parents=True)
    (src / d / "made_by.txt").write_text("first")
  c = demo_config.get_config("smoke")
  c.demo.reuse_sft_from, c.demo.plot = str(src), False
  cfg = from_config_dict(c)
  seen = {}

  def sft(cfg, workdir, chats, tok):  # the copy is there when the SFT phase looks
    seen["sft"] = sorted(os.listdir(os.path.join(workdir, "sft", "hf")))
    return {}

  def rl(cfg, workdir, *a):
    _finished_run(workdir, [{"step": 1, "reward_mean": 0.5}])
    return {}

  monkeypatch.setattr(demo, "phase_data", lambda *a: [])
  monkeypatch.setattr(demo, "phase_tokenizer", lambda *a: None)
  monkeypatch.setattr(demo, "check_heldout_prompts", lambda *a: None)
  monkeypatch.setattr(demo, "phase_sft", sft)
  monkeypatch.setattr(demo, "phase_eval", lambda *a: {})
  monkeypatch.setattr(demo, "phase_rl", rl)
  summary = demo.run_demo(cfg, str(w))
  assert seen["sft"] == ["made_by.txt"] and (w / "tokenizer" / "made_by.txt").exists()
  assert summary["rl_eval_accuracy"] == 0.5 and summary["resolved_config"]
  assert json.loads((w / "summary.json").read_text())["rl_steps"] == 1
  assert json.loads((w / "demo_state.json").read_text())["last_phase"] == "report"
  assert not (w / "demo_plot.png").exists()


def test_rl_phase_reuses_a_finished_export(tmp_path):
  """A rerun after RL finished (``rl/hf`` written): the RL phase reads the exported model back
  instead of training."""
  import jax

  from rstar_jax.learner.checkpoint import export_hf
  from rstar_jax.models import qwen3

  cfg = from_config_dict(demo_config.get_config("smoke"))
  mc = cfg.model.qwen3_config()
  params = qwen3.init_params(mc, jax.random.key(1))
  export_hf(tmp_path / "rl" / "hf", mc, params)
  got = demo.phase_rl(cfg, str(tmp_path), None, None, [], [])
  np.testing.assert_array_equal(
    np.asarray(got["embed_tokens"]["embedding"]), np.asarray(params["embed_tokens"]["embedding"])
  )
  assert not (tmp_path / "rl" / "ckpt").exists()  # no learner was built
