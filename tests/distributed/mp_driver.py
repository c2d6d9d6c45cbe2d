"""Runs a tiny RL / SFT job in this process (one of N under scripts/local_cluster.sh, or alone).

  python tests/distributed/mp_driver.py rl WORKDIR STEPS
  python tests/distributed/mp_driver.py all WORKDIR RL_STEPS SFT_STEPS
                                        (WORKDIR/sft, then WORKDIR/rl, then WORKDIR/eval.json)
  python tests/distributed/mp_driver.py rl_eval WORKDIR RL_STEPS
                                        (WORKDIR/rl, resumed when it has a checkpoint, then
                                         WORKDIR/eval.json)

The tiny random policy never answers correctly, so the reward is a deterministic rule on the
trajectory's own tokens (parity of the token-id sum): groups are mixed, RoC selects, the
advantages are non-zero and every step updates. Process 0 writes ``params.npz`` (the final
params, gathered) in each run's folder and, for SFT, ``hf/`` (the multi-process HF export).
Env RSTAR_TEST_DIE_AT_STEP=s and RSTAR_TEST_DIE_PROCESS=i: process i SIGKILLs itself at the
start of RL step s's rollouts (fault test).
"""

import os
import signal
import sys

import numpy as np


def _flat(tree, prefix=""):
  if isinstance(tree, dict):
    out = {}
    for k, v in tree.items():
      out.update(_flat(v, f"{prefix}{k}/"))
    return out
  return {prefix[:-1]: np.asarray(tree)}


def _config(mode):
  from configs import rstar2_tiny_cpu
  from rstar_jax.config import from_config_dict

  c = rstar2_tiny_cpu.get_config(mode)
  if mode == "rl":
    # The test's own sizes (2 prompts x 4 rollouts, PROMPTS/ROLLOUTS in test_multiprocess.py),
    # kept apart from the recipe's tuning so that a retuned tiny recipe cannot break the test.
    c.rl.group_size, c.rl.oversample = 2, 2
    c.train.batch_prompts = 2
    c.rollout.max_batch = 8
  return from_config_dict(c)


def run_rl(workdir, steps):
  import jax

  from rstar_jax.pipelines import rl_loop
  from rstar_jax.rollout import agent_runner

  async def rule_rewards(self, trajs, answers):
    return [float(sum(t.response_ids) % 2) for t in trajs]

  agent_runner.AgentRunner.rewards = rule_rewards
  die_at = int(os.environ.get("RSTAR_TEST_DIE_AT_STEP", "0"))
  die_proc = int(os.environ.get("RSTAR_TEST_DIE_PROCESS", "-1"))
  orig = rl_loop.RLLoop.rollout

  async def rollout(self, *a, **kw):
    if self.pos.rl_step + 1 == die_at and jax.process_index() == die_proc:
      print(f"test: process {die_proc} kills itself at step {die_at}", flush=True)
      os.kill(os.getpid(), signal.SIGKILL)
    return await orig(self, *a, **kw)

  rl_loop.RLLoop.rollout = rollout
  return rl_loop.run_rl(_config("rl"), workdir, max_steps=steps)


def run_sft(workdir, steps):
  from rstar_jax.pipelines import sft_loop

  out = sft_loop.run_sft(_config("sft"), workdir, max_steps=steps, export=False)
  sft_loop.export_with_tokenizer(
    os.path.join(workdir, "hf"),
    out["learner"].model_config,
    out["learner"].state.params,
    out["tokenizer"],
  )
  return out


def save_params(out, workdir):
  from rstar_jax.distributed import hostdata, primary

  params = hostdata.host_params(out["learner"].state.params)
  if primary.is_primary():
    np.savez(os.path.join(workdir, "params.npz"), **_flat(params))


def main():
  mode, workdir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
  from rstar_jax.pipelines import launch

  launch.setup_logging()
  launch.maybe_initialize_distributed()
  import jax

  if mode == "rl":
    save_params(run_rl(workdir, steps), workdir)
  elif mode in ("all", "rl_eval"):  # [SFT], RL, eval of the RL policy: one start-up
    if mode == "all":
      sft_steps = int(sys.argv[4])
      save_params(run_sft(os.path.join(workdir, "sft"), sft_steps), os.path.join(workdir, "sft"))
    out = run_rl(os.path.join(workdir, "rl"), steps)
    save_params(out, os.path.join(workdir, "rl"))
    from rstar_jax.pipelines import evaluation

    evaluation.run_eval(
      _config("eval"),
      os.path.join(workdir, "eval.json"),
      params=out["learner"].state.params,
      tokenizer=out["tokenizer"],
    )
  else:
    raise SystemExit(f"mode: expected rl, all or rl_eval, got {mode!r}")
  print(f"driver done: process {jax.process_index()} of {jax.process_count()}", flush=True)


if __name__ == "__main__":
  main()
