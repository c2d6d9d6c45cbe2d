"""Every rollout server gone for longer than ``rollout.server_timeout_s`` (issue 41): the RL loop
checkpoints the instant its step started from and stops with `FleetUnavailable`; the launcher
prints it as one line and exits 75; a rerun with the servers back redoes that step and goes on.
The per-step fleet metrics are logged and documented."""

import asyncio
import json

import pytest

from configs import rstar2_tiny_cpu
from rstar_jax import cli
from rstar_jax.config import from_config_dict
from rstar_jax.data import synthetic_tasks
from rstar_jax.data.iterator import EpochIterator
from rstar_jax.pipelines import data_sources, rl_loop, wiring
from rstar_jax.pipelines.metrics_log import read_jsonl_metrics
from rstar_jax.rollout.sglang_engine import FleetUnavailable
from rstar_jax.rollout.testing.mock_sglang import MockSGLangServer


def _config(tmp_path):
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.mesh.num_devices = 1
  cfg.rl.group_size, cfg.rl.oversample = 2, 1
  cfg.rl.drop_zero_variance = False  # a random policy: keep the all-wrong group anyway
  cfg.train.batch_prompts = 1
  cfg.rollout.engine = "sglang"
  cfg.rollout.staging_dir = str(tmp_path / "staging")
  cfg.rollout.server_timeout_s = 0.5
  cfg.rollout.health_interval_s = 0.05
  cfg.rollout.health_timeout_s = 0.5
  cfg.rollout.max_server_failures = 2
  cfg.stages = [
    dict(
      name="s",
      steps=3,
      response_budget=8,
      max_turns=1,
      data="full",
      reset_optimizer=False,
      drop_solved_k_of_k=0,
    )
  ]
  return cfg


@pytest.mark.slow
def test_fleet_lost_checkpoints_the_step_start_and_a_rerun_goes_on(tmp_path, metrics_doc_check):
  cfg = _config(tmp_path)
  problems = synthetic_tasks.generate(3, 6, families=["mul"], difficulty="easy")
  tok = data_sources.ensure_tokenizer(
    from_config_dict(cfg), str(tmp_path / "tok"), data_sources.tokenizer_corpus(problems)
  )
  work = tmp_path / "run"

  class ServerDiesAfterFirstPush(rl_loop.RLLoop):
    server = None

    async def push(self, metrics=None):
      t = await super().push(metrics)
      if self.pos.rl_step == 0 and metrics is not None:  # step 1's push went through
        await self.server.close()
      return t

  def run(loop_cls, port=0):
    async def main():
      server = await MockSGLangServer(vocab_size=1024).start(port)
      cfg.rollout.sglang_urls = [server.url]
      rc = from_config_dict(cfg)
      learner = wiring.build_learner(rc)
      try:
        async with wiring.open_runner(rc, learner.model_config, None, tok) as runner:
          loop = loop_cls(rc, learner, runner, str(work), problems=problems)
          loop.server = server
          try:
            await loop.run()
          finally:
            loop.ckpt.close()
          return loop, server
      finally:
        await server.close()

    return asyncio.run(main())

  with pytest.raises(FleetUnavailable, match=r"rollout\.server_timeout_s") as e:
    run(ServerDiesAfterFirstPush)
  side = json.loads((work / "ckpt" / "loop_position.json").read_text())
  assert side["loop"]["rl_step"] == 1 and side["optimizer_step"] == 1
  it = EpochIterator(problems, seed=int(cfg.train.seed))
  it.next_batch(1)
  assert side["loop"]["data_state"] == it.state_dict()  # step 2's problem not consumed
  recs = read_jsonl_metrics(work / "metrics.jsonl")
  assert [r["step"] for r in recs] == [1]
  assert recs[0]["rollout/servers_healthy"] == 1 and recs[0]["rollout/failovers"] == 0
  metrics_doc_check(recs)

  # The launcher: one line, exit status 75 (a supervisor may rerun it).
  def main(argv):
    raise e.value

  with pytest.raises(SystemExit) as ex:
    cli.wrap(main)([])
  assert ex.value.code == 75

  loop, server = run(rl_loop.RLLoop)  # servers back: the rerun redoes step 2, then step 3
  assert loop.pos.rl_step == 3
  assert [r["step"] for r in read_jsonl_metrics(work / "metrics.jsonl")] == [1, 2, 3]
  assert str(server.weight_version) == "3"
