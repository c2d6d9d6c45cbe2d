"""benchmarks/claims_probe.py: per-unit CPU costs from probe events, the runs a claims.py
invocation executes, and the projection that combines them (no probe run here: the tests feed
known events)."""

import importlib.util
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(name, path):
  spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, path))
  mod = importlib.util.module_from_spec(spec)
  sys.modules[name] = mod
  spec.loader.exec_module(mod)
  return mod


sys.path.insert(0, os.path.join(REPO, "benchmarks"))
probe = _load("claims_probe_bench", "benchmarks/claims_probe.py")
claims = probe.claims


def _events():
  ev = lambda kind, arm, cpu, **kw: {"kind": kind, "arm": arm, "cpu_s": cpu, "wall_s": 0.0, **kw}  # noqa: E731
  return [
    ev("data", "roc_8to4", 10.0, variant="noisy"),
    ev("tokenizer", "roc_8to4", 5.0, variant="noisy"),
    ev("sft", "roc_8to4", 20.0, steps=10, variant="noisy"),
    ev("eval", "roc_8to4", 8.0, trajectories=4, variant="noisy"),
    ev("rl_step", "roc_8to4", 50.0, step=1, trajectories=256, variant="noisy"),
    ev("rl_step", "roc_8to4", 6.0, step=2, trajectories=256, variant="noisy"),
    ev("rl_step", "roc_8to4", 4.0, step=3, trajectories=256, variant="noisy"),
    ev("eval", "roc_8to4", 4.0, trajectories=4, variant="noisy"),
    ev("sft", "dense_t5", 30.0, steps=10, variant="dense"),
    ev("rl_step", "dense_t5", 40.0, step=1, trajectories=256, variant="dense"),
  ]


def test_units_from_events():
  u = probe.units(_events())
  assert u["traj"] == pytest.approx(5.0 / 256)  # median of 6/256 and 4/256
  assert u["eval_call"] == pytest.approx((8.0 - 4 * u["traj"] + 4.0 - 4 * u["traj"]) / 2)
  assert u["sft_step"] == {"noisy": 2.0, "dense": 3.0}
  assert u["data"] == {"noisy": 15.0}
  assert u["rl_first"] == {"roc_8to4": 50.0, "dense_t5": 40.0}
  assert u["rl_step"] == {"roc_8to4": 5.0, "dense_t5": 40.0}  # median of the later steps


def test_plan_counts_sft_models_and_reevaluations():
  runs = probe.plan(claims.parse_args(["--out=/x", "--quick"]))
  assert len(runs) == 4 + 6  # two roc pairs; dense and graded under 3 budgets, one seed
  assert [r["arm"] for r in runs if r["trains_sft"]] == ["roc_8to4", "dense_t3", "graded_t3"]
  # The roc arms reuse the SFT evaluation; each start is re-evaluated under budgets 5 and 8.
  assert [r["arm"] for r in runs if r["evals_sft"]] == [
    "roc_8to4", "dense_t3", "graded_t3", "dense_t5", "graded_t5", "dense_t8", "graded_t8",
  ]  # fmt: skip
  n_eval = claims.QUICK_EVAL_PROBLEMS * 4
  assert all(r["rl_steps"] == claims.QUICK_STEPS and r["eval_trajectories"] == n_eval for r in runs)
  assert all(r["curve_trajectories"] == claims.QUICK_CURVE_PROBLEMS * 4 for r in runs)
  full = probe.plan(claims.parse_args(["--out=/x", "--claims=roc", "--seeds=5"]))
  assert len(full) == 4 * 5 and sum(r["trains_sft"] for r in full) == 1


def test_project_adds_the_parts():
  u = probe.units(_events())
  runs = [
    {"arm": "roc_8to4", "variant": "noisy", "group": (8, 4), "trains_sft": True,
     "evals_sft": True, "rl_steps": 11, "curve_evals": 2, "curve_trajectories": 3,
     "eval_trajectories": 10, "sft_epochs": 10.0},
    {"arm": "grpo_8to4", "variant": "noisy", "group": (8, 4), "trains_sft": False,
     "evals_sft": False, "rl_steps": 11, "curve_evals": 0, "curve_trajectories": 3,
     "eval_trajectories": 10, "sft_epochs": 10.0},
  ]  # fmt: skip
  pick = probe._rl_unit_for(["roc_8to4", "dense_t5"])
  assert pick(runs[1]) == "roc_8to4"
  pr = probe.project(runs, u, {"noisy": {"steps": 10, "epochs": 0.1}}, pick)
  sft = 15.0 + 2.0 * 10 * 10.0 / 0.1  # data + tokenizer, then 1000 SFT steps at 2 cpu-s
  ev = 3 * u["eval_call"] + (10 * 2 + 2 * 3 + 10) * u["traj"]  # 3 evaluation calls
  rl = 2 * (50.0 + 10 * 5.0)
  assert pr["parts"] == pytest.approx(
    {"data_sft": sft, "eval": ev, "rl": rl, "rl_update_estimate": 0.0}
  )
  assert pr["cpu_s"] == pytest.approx(sft + ev + rl)
  assert pr["wall_s_2cores"] == pytest.approx([pr["cpu_s"] / 2, pr["cpu_s"]])
  # An update estimate is added per RL step: 128 rows = 8 SFT batches of 16, plus a forward.
  upd = probe.update_estimate(2.0, 128, 16)
  assert upd == pytest.approx(2.0 * 8 * (1 + 1 / 3))
  with_upd = probe.project(runs, u, {"noisy": {"steps": 10, "epochs": 0.1}}, pick, upd)
  assert with_upd["cpu_s"] == pytest.approx(pr["cpu_s"] + 22 * upd)


def test_events_from_a_probe_log(tmp_path):
  log = tmp_path / "probe.log"
  log.write_text(
    "[demo 11:51:11] sft: done\n"
    "[probe] roc_32to16 sft: 12.8 cpu-s, 75.4 s {'steps': 5}\n"
    "[probe] dense_t5 rl_step: 9.2 cpu-s, 79.7 s {'step': 2, 'trajectories': 256.0}\n"
  )
  ev = probe.events_from_log(str(log))
  assert ev == [
    {"kind": "sft", "arm": "roc_32to16", "cpu_s": 12.8, "wall_s": 75.4, "variant": "noisy",
     "steps": 5},
    {"kind": "rl_step", "arm": "dense_t5", "cpu_s": 9.2, "wall_s": 79.7, "variant": "dense",
     "step": 2, "trajectories": 256.0},
  ]  # fmt: skip
