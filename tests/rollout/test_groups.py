"""The one seed rule of trajectory groups reproduces the rules written before it (RL step,
evaluation), so runs and reports made before the group sources keep their samples."""

from rstar_jax.pipelines.evaluation import EVAL_PROBLEM_STRIDE
from rstar_jax.rollout import groups, sources

M = 2**31 - 1


def test_group_and_sample_seeds_match_the_earlier_formulas():
  for seed0 in (0, 12345, M - 3):
    rl = sources.group_seeds(seed0, 5)
    assert [groups.sample_seed(rl[i], j) for i in range(5) for j in range(4)] == [
      (seed0 + i * 7_368_787 + j * 104_729) % M for i in range(5) for j in range(4)
    ]
  for seed in (0, 7, 2**20):
    ev = sources.group_seeds(seed * 1_000_003 + 17, 6, EVAL_PROBLEM_STRIDE)
    assert [groups.sample_seed(ev[i], j) for i in range(6) for j in range(3)] == [
      (seed * 1_000_003 + i * 7_919 + j * 104_729 + 17) % M for i in range(6) for j in range(3)
    ]
