"""benchmarks/claims.py (issue 30): the aggregation over seeds, the per-run configs, and a smoke
run of all four arms through the real demo pipeline (JSON keys, PNGs, shared SFT models)."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _claims():
  spec = importlib.util.spec_from_file_location(
    "claims_bench", os.path.join(REPO, "benchmarks", "claims.py")
  )
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


claims = _claims()

METRICS = (
  "pos_tool_error_ratio",
  "format_penalty_rate",
  "response_length_mean",
  "tool_calls_per_traj",
  "reward_mean",
)


def _run(seed, errs, eq1, before, after):
  rows = [
    {
      "step": i + 1,
      "pos_tool_error_ratio": e,
      "answer_tags_eq1_frac": q,
      "response_length_mean": 100.0 - i,
      "tool_calls_per_traj": 2.0,
      "reward_mean": 0.5 + 0.1 * i,
      "penalty_pos_mean": e,
    }
    for i, (e, q) in enumerate(zip(errs, eq1))
  ]
  rows[1]["eval_accuracy"] = 0.4 + seed
  ev = lambda a: {  # noqa: E731
    "accuracy": a,
    "tool_calls_per_traj": 2.0,
    "pos_tool_error_ratio": 0.1,
    "response_length_mean": 90.0,
  }
  return {"seed": seed, "rows": rows, "before": ev(before), "after": ev(after), "wall_time_s": 1.0}


def test_aggregate_arm_series_first_last_and_spread():
  runs = [
    _run(0, [0.3, 0.2, 0.1], [0.9, 1.0, 1.0], 0.5, 0.7),
    _run(1, [0.5, 0.4, None], [0.8, 0.8, 0.9], 0.5, 0.6),
  ]
  a = claims.aggregate_arm(runs)
  assert a["seeds"] == [0, 1] and a["rl_steps"] == 3
  s = a["series"]["pos_tool_error_ratio"]
  assert s["step"] == [1, 2, 3] and s["mean"][:2] == pytest.approx([0.4, 0.3])
  assert s["std"][0] == pytest.approx(np.std([0.3, 0.5], ddof=1))
  assert s["mean"][2] == 0.1 and s["std"][2] == 0.0  # a missing value is left out, not zeroed
  assert (s["min"][0], s["max"][0]) == (0.3, 0.5) and s["per_seed"][1] == [0.5, 0.4, None]
  fp = a["series"]["format_penalty_rate"]["mean"]
  assert fp == pytest.approx([0.15, 0.1, 0.05])  # 1 - answer_tags_eq1_frac
  fl = a["first_last"]["pos_tool_error_ratio"]
  assert fl["first"]["mean"] == pytest.approx(0.4)
  assert fl["last"]["mean"] == pytest.approx(0.25)  # seed 1's last present value is 0.4
  assert a["series"]["curve_eval_accuracy"]["mean"] == [None, pytest.approx(0.9), None]
  acc = a["heldout"]["accuracy"]
  assert acc["before"]["mean"] == 0.5 and acc["before"]["std"] == 0.0
  assert acc["after"]["mean"] == pytest.approx(0.65) and acc["gain"]["mean"] == pytest.approx(0.15)
  assert acc["per_seed"] == [{"before": 0.5, "after": 0.7}, {"before": 0.5, "after": 0.6}]
  for m in METRICS:
    assert set(a["first_last"][m]) == {"first", "last", "per_seed"}
  with pytest.raises(ValueError, match="no runs"):
    claims.aggregate_arm([])


def test_table_has_a_row_per_seed_and_a_mean_row():
  a = claims.aggregate_arm(
    [_run(0, [0.3, 0.2], [1.0, 1.0], 0.5, 0.7), _run(1, [0.5, None], [1.0, 1.0], 0.5, 0.6)]
  )
  lines = claims.table_markdown({"roc": a}).splitlines()
  assert len(lines) == 2 + 2 + 1 and lines[0].startswith("| arm | seed |")
  assert lines[2].startswith("| roc | 0 | 0.500 -> 0.700 | 0.300 -> 0.200 |")
  assert "| 0.500 -> 0.500 |" in lines[3]  # seed 1's last present ratio
  assert lines[4].startswith("| **roc** | mean (sd) of 2 | 0.500 -> 0.650 (0.071) |")


def test_plot_claim_writes_both_arms(tmp_path):
  import matplotlib.image

  a = claims.aggregate_arm([_run(0, [0.3, 0.2], [1.0, 1.0], 0.5, 0.7)])
  b = claims.aggregate_arm([_run(0, [0.3, 0.4], [1.0, 0.5], 0.5, 0.6)])
  path = str(tmp_path / "c.png")
  claims.plot_claim("roc", {"roc": a, "grpo": b}, path)
  img = matplotlib.image.imread(path)
  assert img.ndim == 3 and img.shape[1] > 600 and np.ptp(img) > 0


def test_arm_configs_share_sft_and_differ_only_in_rl():
  args = claims.parse_args(["--out=/x", "--smoke", "--max_turns=4", "--tool_failure_rate=0.2"])
  roc = claims.arm_config("noisy", "paper", 0, args, "")
  grpo = claims.arm_config("noisy", "random", 2, args, "/x/roc/seed0")
  assert (roc.rl.roc_mode, grpo.rl.roc_mode) == ("paper", "random")
  assert (roc.train.seed, grpo.train.seed) == (0, 2) and grpo.demo.reuse_sft_from == "/x/roc/seed0"
  assert roc.coldstart == grpo.coldstart and roc.coldstart.explore_fail_prob > 0
  assert roc.tool.inject_failure_rate == 0.2 and roc.stages[0].max_turns == 3  # noisy: config's
  dense = claims.arm_config("dense", "paper", 0, args, "")
  sparse = claims.arm_config("sparse", "paper", 0, args, "")
  assert dense.data == sparse.data and "mul_last_digit" in dense.data.synthetic.families
  assert (dense.coldstart.style, sparse.coldstart.style) == ("dense", "sparse")
  assert dense.stages[0].max_turns == sparse.eval.max_turns == 4 == dense.rollout.max_turns
  assert dense.tool.inject_failure_rate == 0.0
  quick = claims.parse_args(["--out=/x", "--quick"])
  assert (
    quick.steps == 20 and claims.arm_config("dense", "paper", 0, quick, "").stages[0].steps == 20
  )
  for bad in (["--claims=roc,nope"], ["--seeds=0"], ["--tool_failure_rate=1.5"]):
    with pytest.raises(SystemExit):
      claims.parse_args(["--out=/x", *bad])


def _run_claims(*args):
  return subprocess.run(
    [sys.executable, "benchmarks/claims.py", *args],
    cwd=REPO,
    env={**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"},
    capture_output=True,
    text=True,
    timeout=900,
  )


@pytest.mark.slow
def test_claims_smoke_json_and_plots(tmp_path):
  out = str(tmp_path / "claims")
  proc = _run_claims(f"--out={out}", "--smoke", "--json")
  assert proc.returncode == 0, f"claims failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
  res = json.loads(proc.stdout)  # --json: stdout is the JSON alone (issue 43 row 6)
  assert res == json.load(open(os.path.join(out, "claims.json")))
  table = open(res["table"]).read()
  assert table.count("| seed") == 1 and len(table.splitlines()) == 2 + 4 * 2
  assert set(res["arms"]) == {"roc", "grpo", "dense", "sparse"}
  for arm, a in res["arms"].items():
    assert a["seeds"] == [0] and a["rl_steps"] == 2, arm
    for m in METRICS:
      assert len(a["series"][m]["mean"]) == 2 and set(a["first_last"][m]) >= {"first", "last"}
    for when in ("before", "after"):
      assert 0 <= a["heldout"]["accuracy"][when]["mean"] <= 1
  assert {a["roc_mode"] for a in res["arms"].values()} == {"paper", "random"}
  assert res["arms"]["grpo"]["roc_mode"] == "random"
  assert (
    isinstance(res["noisy_start_ok"], bool) and len(res["noisy_start_pos_tool_error_ratio"]) == 2
  )
  for claim in ("roc", "aster"):
    png = res["claims"][claim]["png"]
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"

  # The GRPO arm trained from the RoC arm's SFT model (same weights, same SFT eval).
  def sft(arm):
    with open(os.path.join(out, arm, "seed0", "sft", "hf", "model.safetensors"), "rb") as f:
      return f.read()

  assert sft("roc") == sft("grpo")
  assert os.path.isdir(os.path.join(out, "roc", "seed0", "sft", "ckpt"))  # trained there only
  assert not os.path.exists(os.path.join(out, "grpo", "seed0", "sft", "ckpt"))
  stats = json.load(open(os.path.join(out, "roc", "seed0", "coldstart_stats.json")))
  assert stats["calls_failed"] / stats["calls_total"] >= 0.1  # the noisy cold start
  sparse = json.load(open(os.path.join(out, "sparse", "seed0", "coldstart_stats.json")))
  assert sparse["mean_tool_calls_kept"] == 1.0

  # A budget-sweep point reuses those SFT models: the SFT evaluation, made under the old budget,
  # reruns (--discard_stale), the SFT model itself is copied, not retrained.
  out2 = str(tmp_path / "mt2")
  proc = _run_claims(
    f"--out={out2}",
    "--smoke",
    "--claims=aster",
    "--max_turns=2",
    f"--sft_from={out}",
    "--discard_stale",
    "--json",
  )
  assert proc.returncode == 0, f"sweep failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
  res2 = json.loads(proc.stdout)
  assert set(res2["arms"]) == {"dense", "sparse"} and res2["settings"]["max_turns"] == 2
  for arm in ("dense", "sparse"):
    with open(os.path.join(out2, arm, "seed0", "sft", "hf", "model.safetensors"), "rb") as f:
      assert f.read() == sft(arm)
    assert not os.path.exists(os.path.join(out2, arm, "seed0", "sft", "ckpt"))
    rec = json.load(open(os.path.join(out2, arm, "seed0", "resolved_config", "eval_sft.json")))
    assert rec["rollout.max_turns"] == rec["eval.max_turns"] == 2  # reran under the new budget


def test_sft_from_points_each_cold_start_at_its_first_arm(tmp_path):
  prev = tmp_path / "prev"
  for arm in ("roc", "dense", "sparse"):
    (prev / arm / "seed0" / "sft").mkdir(parents=True)
  args = claims.parse_args(
    [f"--out={tmp_path / 'mt2'}", "--max_turns=2", f"--sft_from={prev}", "--discard_stale"]
  )
  assert args.discard_stale and args.sft_from == str(prev)
  # noisy's SFT model was trained by the roc arm (grpo reused it); dense and sparse by their own.
  assert claims.sft_source("noisy", "/w", args.sft_from) == str(prev / "roc" / "seed0")
  assert claims.sft_source("sparse", "/w", args.sft_from) == str(prev / "sparse" / "seed0")
  assert claims.sft_source("dense", "/w", "") == "/w"  # no --sft_from: the run trains its own
  cfg = claims.arm_config("dense", "paper", 0, args, claims.sft_source("dense", "/w", prev))
  assert cfg.demo.reuse_sft_from == str(prev / "dense" / "seed0") and cfg.rollout.max_turns == 2


def test_sft_from_without_the_models_is_one_line(tmp_path, capsys):
  (tmp_path / "prev" / "dense" / "seed0" / "sft").mkdir(parents=True)
  with pytest.raises(SystemExit):
    claims.parse_args([f"--out={tmp_path}/o", f"--sft_from={tmp_path / 'prev'}", "--claims=aster"])
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert "--sft_from: no SFT model in" in err and "sparse/seed0" in err and "dense" not in err
  with pytest.raises(SystemExit):
    claims.parse_args(
      [f"--out={tmp_path}/prev", f"--sft_from={tmp_path / 'prev'}", "--claims=aster"]
    )
  assert "--out itself" in capsys.readouterr().err
