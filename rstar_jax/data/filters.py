"""Training-set filters applied once before RL starts (never an exception mid-run).

    kept, counts = filter_problems(problems, integer_answers_only=True,
                                   max_prompt_tokens=2048, prompt_length=runner.prompt_length)

integer_answers_only: rStar2-Agent trains on integer-answer problems only (paper §4; the
    released recipe's DAPO-Math-17k set is integer-answer by construction).
max_prompt_tokens: the released verl recipe sets data.filter_overlong_prompts=True with
    max_prompt_length=2048: prompts longer than that are dropped when the set is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rstar_jax.data.problems import Problem, is_integer_text


def filter_problems(
  problems: Sequence[Problem],
  *,
  integer_answers_only: bool = False,
  max_prompt_tokens: int = 0,
  prompt_length: Callable[[Problem], int] | None = None,
) -> tuple[list[Problem], dict[str, int]]:
  """(kept problems in order, counts) after the enabled filters.

  Args:
      problems: the training set.
      integer_answers_only: drop problems whose gold answer is not an integer.
      max_prompt_tokens: drop problems whose rendered prompt is longer (0 = no limit);
          needs ``prompt_length`` (problem -> number of prompt tokens).
  Returns:
      counts: ``filter_total``, ``filter_kept``, ``filter_dropped_non_integer``,
      ``filter_dropped_overlong``.
  """
  if max_prompt_tokens < 0:
    raise ValueError(f"filter_problems: max_prompt_tokens must be >= 0, got {max_prompt_tokens}")
  if max_prompt_tokens and prompt_length is None:
    raise ValueError("filter_problems: max_prompt_tokens needs prompt_length")
  kept: list[Problem] = []
  non_int = overlong = 0
  for p in problems:
    if integer_answers_only and not is_integer_text(p.answer):
      non_int += 1
    elif max_prompt_tokens and prompt_length(p) > max_prompt_tokens:
      overlong += 1
    else:
      kept.append(p)
  return kept, {
    "filter_total": len(problems),
    "filter_kept": len(kept),
    "filter_dropped_non_integer": non_int,
    "filter_dropped_overlong": overlong,
  }
