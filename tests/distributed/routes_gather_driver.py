"""One process of the routes gather check (`test_routes_gather.py`), under scripts/local_cluster.sh.

Each process makes the groups of its share of the problems (`groups.make_groups`) with a fake
runner whose trajectories carry MoE routes that are a known function of (problem, seed,
position); after the all-gather every process checks every trajectory's routes, then builds
the RL batch and checks the routes rode along. Prints "routes ok" on success.
"""

import asyncio

import numpy as np


def route_rows(problem: int, seed: int, n: int) -> np.ndarray:
  pos = np.arange(n)[:, None, None]
  r = problem * 1000 + seed % 997 + pos * 3 + np.arange(3)[None, :, None] * 11 + np.arange(2)
  r = r.astype(np.int32)
  r[:, 1] = -1  # a dense layer
  r[-1] = -1  # the last token: never fed
  return r


class Runner:
  async def rollout(self, problem, seed, settings):
    import jax

    from rstar_jax.rollout.types import Trajectory

    prompt, resp = [1, 2, 3 + problem], [4 + jax.process_index(), 5, 6, 7][: 2 + problem % 3]
    n = len(prompt) + len(resp)
    return Trajectory(
      prompt_ids=prompt,
      response_ids=resp,
      loss_mask=[1] * len(resp),
      logprobs=[-0.5] * len(resp),
      weight_versions=[0] * len(resp),
      num_turns=1,
      tool_calls=[],
      finish_reason="stop",
      problem_index=problem,
      routes=route_rows(problem, seed, n),
    )


def main():
  from rstar_jax.pipelines import launch

  assert launch.maybe_initialize_distributed(), "expected a multi-process run"
  import jax

  from rstar_jax.learner import batch as batch_lib
  from rstar_jax.rollout import groups

  problems = list(range(5))
  seeds = [100 + i for i in problems]
  out = asyncio.run(groups.make_groups(Runner(), problems, seeds, 2, None, max_retries=0))
  assert out.generated == 10, out.generated
  trajs = [t for g in out.groups for t in g]
  for i, g in enumerate(out.groups):
    for j, t in enumerate(g):
      want = route_rows(i, groups.sample_seed(seeds[i], j), len(t.prompt_ids) + len(t.response_ids))
      np.testing.assert_array_equal(t.routes, want)
  makers = {t.response_ids[0] - 4 for t in trajs}
  assert makers == set(range(jax.process_count())), makers  # both processes made some
  batch = batch_lib.make_rl_batch(trajs, [0.0] * len(trajs), 16)
  for n, t in enumerate(trajs):
    np.testing.assert_array_equal(batch["routes"][n, : len(t.routes)], t.routes)
  print(f"routes ok: process {jax.process_index()} of {jax.process_count()}", flush=True)


if __name__ == "__main__":
  main()
