"""benchmarks/claims.py's driver parts that only the long tier's smoke run reached (issue 38 item
4), with the demo runs stood in for: `run_one` reading a finished run back, an --arms subset
whose SFT model's home run is a record only (the model trained again there, once), records
written then reused, the calls plot, and `main`'s one-line exit on a stale record."""

import hashlib
import importlib.util
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _claims():
  spec = importlib.util.spec_from_file_location(
    "claims_bench_drivers", os.path.join(REPO, "benchmarks", "claims.py")
  )
  mod = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = mod  # dataclasses look their module up there
  spec.loader.exec_module(mod)
  return mod


claims = _claims()


def _write(path, text, mode="w"):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, mode) as f:
    f.write(text)


def _finished_run(wd, seed, calls=2.0):
  """What demo.run_demo leaves: the RL metrics (out of step order), both evaluations, the SFT
  model."""
  rows = [
    {"step": s, "pos_tool_error_ratio": 0.1 * s, "tool_calls_per_traj": calls} for s in (2, 1)
  ]
  _write(os.path.join(wd, "rl", "metrics.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))
  for name, acc in (("eval_sft.json", 0.25), ("eval_rl.json", 0.5)):
    ev = {"accuracy": acc + seed, "tool_calls_per_traj": calls}
    _write(os.path.join(wd, name), json.dumps({"metrics": ev}))
  _write(os.path.join(wd, "sft", "hf", "model.safetensors"), b"weights", "wb")


def test_run_one_reads_the_finished_run_back(tmp_path, monkeypatch):
  from rstar_jax.pipelines import demo

  args = claims.parse_args([f"--out={tmp_path}"])
  cfg = claims.arm_config(claims.build_arms(args)[0], 3, args, "")
  wd = str(tmp_path / "seed3")
  seen = []

  def run_demo(run_cfg, workdir, discard_stale=False):
    seen.append((workdir, discard_stale))
    _finished_run(workdir, 3)
    return {"wall_time_s": 12.5}

  monkeypatch.setattr(demo, "run_demo", run_demo)
  got = claims.run_one(cfg, wd, discard_stale=True)
  assert seen == [(wd, True)]
  assert got["seed"] == 3 and [r["step"] for r in got["rows"]] == [1, 2]  # in step order
  assert got["before"]["accuracy"] == 3.25 and got["after"]["accuracy"] == 3.5
  assert got["wall_time_s"] == 12.5
  assert got["sft_sha256"] == hashlib.sha256(b"weights").hexdigest()
  assert claims.sft_sha256(str(tmp_path / "nowhere")) is None
  monkeypatch.setattr(demo, "run_demo", lambda *a, **kw: None)  # RL stopped early
  with pytest.raises(RuntimeError, match="seed3: RL stopped early"):
    claims.run_one(cfg, wd)


def test_an_arms_subset_retrains_a_record_only_sft_model_once_then_reuses_the_records(
  tmp_path, monkeypatch
):
  out, records = tmp_path / "out", tmp_path / "records"
  runs, sft = [], []

  def fake_run_one(cfg, workdir, discard_stale=False):
    runs.append(os.path.relpath(workdir, out))
    seed = int(os.path.basename(workdir).removeprefix("seed"))
    return {
      "seed": seed,
      "rows": [
        {"step": 1, "tool_calls_per_traj": 2.0, "curve_eval_tool_calls_per_traj": 1.5,
         "pos_tool_error_ratio": 0.3, "reward_mean": 0.5},
      ],
      "before": {"accuracy": 0.25, "tool_calls_per_traj": 1.0},
      "after": {"accuracy": 0.5, "tool_calls_per_traj": 2.5},
      "wall_time_s": 1.0,
      "sft_sha256": "abc",
    }  # fmt: skip

  def fake_prepare_sft(home_cfg, workdir, discard_stale):
    sft.append(os.path.relpath(workdir, out))
    _write(os.path.join(workdir, "sft", "hf", "model.safetensors"), b"w", "wb")

  monkeypatch.setattr(claims, "run_one", fake_run_one)
  monkeypatch.setattr(claims, "prepare_sft", fake_prepare_sft)
  argv = [f"--out={out}", "--seeds=1", "--budgets=3", "--arms=grpo_8to4,graded_t3"]
  argv += [f"--records={records}"]
  first = claims.run_claims(claims.parse_args(argv))
  # grpo_8to4's SFT model lives in roc_8to4's seed-0 run (not in this subset): trained there,
  # up to its evaluation; graded_t3 is its own cold start's home.
  assert sft == ["roc_8to4/seed0"] and runs == ["grpo_8to4/seed0", "graded_t3/seed0"]
  assert sorted(first["arms"]) == ["graded_t3", "grpo_8to4"] and first["comparisons"] == {}
  assert first["settings"]["arms"] == ["grpo_8to4", "graded_t3"]
  assert first["arms"]["grpo_8to4"]["sft_sha256"] == ["abc"]
  with open(first["calls_png"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert first["noisy_start_pos_tool_error_ratio"] == [pytest.approx(0.3)]
  rec = json.loads((records / "grpo_8to4" / "seed0.json").read_text())
  assert rec["run"]["seed"] == 0 and rec["config"]
  runs.clear()
  again = claims.run_claims(claims.parse_args(argv))
  assert runs == [] and sft == ["roc_8to4/seed0"]  # both from their records
  assert again["arms"]["grpo_8to4"]["seeds_from_records"] == [0]
  assert again["arms"]["graded_t3"]["heldout"] == first["arms"]["graded_t3"]["heldout"]


def test_main_prints_the_table_and_a_stale_record_is_one_line(tmp_path, monkeypatch, capsys):
  table = tmp_path / "t.md"
  table.write_text("| arm | seed |\n")
  monkeypatch.setattr(claims, "run_claims", lambda args: {"table": str(table)})
  claims.main([f"--out={tmp_path}"])
  assert capsys.readouterr().out == "| arm | seed |\n\n"

  def stale(args):
    raise claims.StaleRecordError("r/seed0.json: recorded under other settings: rl.k 4 -> 8")

  monkeypatch.setattr(claims, "run_claims", stale)
  with pytest.raises(SystemExit) as e:
    claims.main([f"--out={tmp_path}"])
  assert e.value.code == "claims: r/seed0.json: recorded under other settings: rl.k 4 -> 8"


def test_a_paired_difference_of_one_seed_has_no_interval():
  assert claims._ci({"mean": 0.25, "lo": None, "hi": None, "n": 1}) == "+0.250 (n=1, no interval)"
  assert (
    claims._ci({"mean": -0.1, "lo": -0.2, "hi": 0.05, "n": 5}) == "-0.100 [-0.200, +0.050] (n=5)"
  )
  assert claims._ci({"mean": None, "lo": None, "hi": None, "n": 0}) == "-"
