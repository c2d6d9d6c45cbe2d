"""Eval protocols (released / paper_avg_at_k), avg@k + pass@k with a per-problem CSV, and the
public MATH-500 / AIME JSONL layouts."""

import asyncio
import csv
import json
import logging
import pathlib

import pytest

from configs import rstar2_qwen3_14b
from rstar_jax.config import ConfigError, eval_protocols, from_config_dict
from rstar_jax.data.eval_sets import load_eval_problems
from rstar_jax.data.jsonl import DataError
from rstar_jax.data.problems import Problem
from rstar_jax.pipelines import evaluation
from rstar_jax.pipelines.wiring import eval_settings
from rstar_jax.rollout.agent_loop import RolloutSettings
from rstar_jax.rollout.types import Trajectory

MATH500 = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data" / "math500.jsonl"


def _run(cfg):
  return from_config_dict(cfg, "eval", check_inputs=False)


def test_protocols_resolve_to_their_settings():
  cfg = rstar2_qwen3_14b.get_config("eval")
  run = _run(cfg)
  assert run.eval.protocol == "released"
  s = eval_settings(run)
  assert (s.temperature, s.top_p, s.max_turns, s.response_budget) == (0.0, 1.0, 5, 30720)
  assert s.max_parallel_calls == 1  # the tool-loop limits stay the recipe's
  assert eval_protocols.resolve(run.eval).k == 16
  cfg.eval.protocol = "paper_avg_at_k"
  s = eval_settings(_run(cfg))
  assert (s.temperature, s.top_p, s.max_turns, s.response_budget) == (0.6, 0.95, 30, 30720)
  cfg.eval.protocol, cfg.eval.temperature, cfg.eval.k, cfg.eval.max_turns = "", 1.0, 4, 7
  run = _run(cfg)
  assert eval_settings(run).temperature == 1.0 and eval_settings(run).max_turns == 7
  assert eval_protocols.resolve(run.eval) is run.eval and run.eval.k == 4
  cfg.eval.protocol = "avg"
  with pytest.raises(ConfigError, match="eval.protocol"):
    _run(cfg)


def test_protocol_keeps_user_values_and_logs_each_replaced_field(caplog):
  """Issue 29 row 3: before, eval.protocol='released' silently replaced --config.eval.k=2 and
  eval.response_budget=96 (16 samples of 30,720 tokens)."""
  cfg = rstar2_qwen3_14b.get_config("eval")
  cfg.eval.k, cfg.eval.response_budget = 2, 96
  run = _run(cfg)
  eff, notes = eval_protocols.resolve_with_notes(run.eval)
  assert (eff.k, eff.response_budget) == (2, 96)  # the user's values win
  assert (eff.temperature, eff.top_p, eff.max_turns) == (0.0, 1.0, 5)  # the rest: the protocol
  assert eval_settings(run).response_budget == 96
  assert "eval.temperature: 0.6 -> 0.0 (eval.protocol='released')" in notes
  assert "eval.k: keeping the given 2 (eval.protocol='released' sets 16)" in notes
  eval_protocols._LOGGED.clear()
  with caplog.at_level(logging.INFO, logger=eval_protocols.__name__):
    eval_protocols.resolve(run.eval)
    eval_protocols.resolve(run.eval)  # each field is logged once, not per evaluation
  logged = [r.getMessage() for r in caplog.records]
  assert sorted(logged) == sorted(notes) and len(logged) == len(set(logged))


def test_strict_protocol_names_the_conflicting_field():
  cfg = rstar2_qwen3_14b.get_config("eval")
  cfg.eval.protocol_strict = True
  assert eval_protocols.resolve(_run(cfg).eval).k == 16  # nothing given: no conflict
  cfg.eval.response_budget = 96
  with pytest.raises(ConfigError) as e:
    eval_protocols.resolve(_run(cfg).eval)
  msg = str(e.value)
  assert "\n" not in msg.strip() and "eval.response_budget" in msg and "96" in msg
  assert "30720" in msg


class _FakeRunner:
  """Problem i is answered correctly by samples j < correct[i] (rewards only; no engine)."""

  def __init__(self, correct):
    self.correct, self.seen = correct, []

  async def rollout(self, problem, *, seed, settings):
    t = Trajectory(
      [1], [2, 3], [1, 1], [0.0, 0.0], [0, 0], 1, [], "stop", response_text=problem.problem
    )
    self.seen.append(problem.problem)
    return t

  async def rewards(self, trajs, answers):
    out, count = [], {}
    for t in trajs:
      i = int(t.response_text[1:])
      j = count.get(i, 0)
      count[i] = j + 1
      out.append(1.0 if j < self.correct[i] else 0.0)
    return out


def test_avg_and_pass_at_k_and_csv(tmp_path):
  probs = [Problem(f"p{i}", str(i)) for i in range(3)]
  runner = _FakeRunner([4, 1, 0])
  rep = asyncio.run(evaluation.evaluate(runner, probs, RolloutSettings(100, 5), k=4))
  m = rep["metrics"]
  assert m["avg_at_k"] == pytest.approx(5 / 12) and m["pass_at_k"] == pytest.approx(2 / 3)
  path = tmp_path / "per_problem.csv"
  evaluation.write_csv(rep, path)
  rows = list(csv.DictReader(open(path, encoding="utf-8")))
  assert [(r["problem"], r["num_correct"], float(r["avg_at_k"]), r["pass_at_k"]) for r in rows] == [
    ("p0", "4", 1.0, "1"),
    ("p1", "1", 0.25, "1"),
    ("p2", "0", 0.0, "0"),
  ]


@pytest.mark.parametrize(
  "layout",
  [
    {"problem": "P?", "answer": "204", "solution": "...", "id": 60},  # HuggingFaceH4/aime_2024
    {"Problem": "P?", "Answer": 204, "ID": "2024-I-1", "Solution": "..."},  # Maxwell-Jia/AIME_2024
    {"question": "P?", "answer": "204"},  # opencompass/AIME2025
  ],
)
def test_aime_layouts(tmp_path, layout):
  path = tmp_path / "aime.jsonl"
  path.write_text(json.dumps(layout) + "\n")
  assert load_eval_problems(path) == [Problem("P?", "204")]


def test_layout_errors_name_field(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps({"prompt": "x", "answer": "1"}) + "\n")
  with pytest.raises(DataError, match="bad.jsonl:1: field 'problem'"):
    load_eval_problems(path)


def test_math500_shared_file():
  if not MATH500.exists():
    pytest.skip(f"MATH-500 file not found at {MATH500} (../shared/data is optional)")
  probs = load_eval_problems(MATH500)
  assert len(probs) == 500
  assert probs[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
  assert all("\\boxed" not in p.answer for p in probs)
