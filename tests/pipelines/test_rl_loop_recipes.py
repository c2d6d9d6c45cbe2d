"""The RL loop with the recipe options of docs/fidelity.md on the tiny model: TIS (rl.tis_cap)
with 2 updates per step, the ASTER stage-2 subset from recent training rollouts, and the
training-set filters (non-integer answers and overlong prompts dropped and counted)."""

import os
import sys

from rstar_jax.data.problems import Problem
from rstar_jax.pipelines.metrics_log import read_jsonl_metrics
from rstar_jax.tokenization import chat_format

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_rl_loop import _config, _problems, _run, setup  # noqa: E402,F401


def test_tis_recent_subset_and_filters(setup, tmp_path):  # noqa: F811
  _, problems, tok = setup
  cfg = _config()
  cfg.rl.tis_cap = 2.0
  cfg.rl.ppo_mini_batches = 2
  cfg.optim.warmup_steps = 0
  cfg.train.eval_every = 0
  cfg.data.integer_answers_only = True
  cfg.data.drop_overlong_prompts = True
  longest = max(len(chat_format.prompt_ids(tok, "rstar2", p.problem)) for p in problems)
  cfg.rollout.max_prompt_tokens = longest
  extra = [Problem("What is one half?", "\\frac{1}{2}"), Problem("What is 2+2? " * 50, "4")]
  cfg.stages = [
    dict(
      name="s1",
      steps=3,
      response_budget=16,
      max_turns=1,
      data="full",
      reset_optimizer=False,
      drop_solved_k_of_k=0,
    ),
    dict(
      name="s2_recent",
      steps=1,
      response_budget=16,
      max_turns=1,
      data="recent",
      reset_optimizer=False,
      drop_solved_k_of_k=0,
      recent_steps=3,
    ),
  ]
  loop, _ = _run(cfg, tmp_path, problems + extra, tok, max_steps=None)
  recs = read_jsonl_metrics(tmp_path / "metrics.jsonl")
  assert len(recs) == 4
  r = recs[0]
  assert (
    r["filter_total"],
    r["filter_kept"],
    r["filter_dropped_non_integer"],
    r["filter_dropped_overlong"],
  ) == (8, 6, 1, 1)
  # TIS is active in the learner: its weight metrics come back, and 2 updates ran per step.
  assert r["ppo_updates"] == 2 and "is_weight_mean" in r and r["is_weight_mean"] > 0
  # 3 stage-1 steps of 2 prompts saw all 6 problems; only index 3 (even answer) was all correct.
  assert loop.pos.hard_indices == [0, 1, 2, 4, 5]
  assert loop.pos.hard_subset_stats["recent_dropped"] == 1
