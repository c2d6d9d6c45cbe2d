"""Training-set filters: integer answers only; overlong prompts dropped and counted."""

import pytest

from rstar_jax.config import ConfigError
from rstar_jax.data.filters import filter_problems
from rstar_jax.data.problems import Problem
from rstar_jax.pipelines import stages


def _probs():
  return [
    Problem("short int", "12"),
    Problem("short frac", "\\frac{1}{2}"),
    Problem("a very long question " * 10, "7"),
    Problem("neg", "-3"),
  ]


def test_integer_and_length_filters_count_drops():
  kept, c = filter_problems(
    _probs(),
    integer_answers_only=True,
    max_prompt_tokens=50,
    prompt_length=lambda p: len(p.problem),
  )
  assert [p.problem for p in kept] == ["short int", "neg"]
  assert c == {
    "filter_total": 4,
    "filter_kept": 2,
    "filter_dropped_non_integer": 1,
    "filter_dropped_overlong": 1,
  }


def test_filters_off_keep_everything():
  kept, c = filter_problems(_probs())
  assert len(kept) == 4 and c["filter_kept"] == 4


def test_length_filter_needs_a_length_function():
  with pytest.raises(ValueError, match="needs prompt_length"):
    filter_problems(_probs(), max_prompt_tokens=10)


def test_recent_unsolved_subset_latest_appearance_wins():
  history = [[[0, True], [1, True]], [[1, False], [2, True]], [[3, False]]]
  kept, stats = stages.recent_unsolved_subset(5, history)
  assert kept == [1, 3, 4]  # 0 and 2 all-correct at their latest appearance; 4 unseen
  assert stats == {"recent_window_steps": 3, "recent_seen": 4, "recent_dropped": 2}
  with pytest.raises(ValueError, match="outside"):
    stages.recent_unsolved_subset(2, [[[5, True]]])
  with pytest.raises(ConfigError, match="stage.recent_steps"):
    stages.Stage(name="s2", steps=10, response_budget=100, max_turns=5, data="recent")
