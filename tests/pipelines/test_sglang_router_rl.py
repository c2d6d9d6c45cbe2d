"""`rollout.router_url` (issue 41, item 2): SGLang's real router (`sglang-router`, started from
the installed package on 127.0.0.1) in front of two stand-in workers; a smoke RL run goes
through it while one worker is killed with SIGKILL in the middle of step 2. The run finishes,
the push reaches every worker the router still lists (found through its ``GET /workers``), and
the killed worker is taken off the router."""

import asyncio
import threading

import pytest

pytest.importorskip("sglang_router", reason="sglang-router (setup.py test extra) not installed")

from configs import rstar2_tiny_cpu  # noqa: E402
from rstar_jax.config import from_config_dict  # noqa: E402
from rstar_jax.data import synthetic_tasks  # noqa: E402
from rstar_jax.pipelines import data_sources, rl_loop, wiring  # noqa: E402
from rstar_jax.pipelines.metrics_log import read_jsonl_metrics  # noqa: E402
from rstar_jax.rollout.testing.mock_sglang import MockSGLangServer  # noqa: E402
from rstar_jax.rollout.testing.processes import RouterProcess, StandInProcess  # noqa: E402


class _ServerThread:
  """An in-process stand-in on its own event loop (the RL run uses asyncio.run)."""

  def __init__(self, **kw):
    self.loop = asyncio.new_event_loop()
    self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
    self.thread.start()
    self.server = asyncio.run_coroutine_threadsafe(
      MockSGLangServer(**kw).start(), self.loop
    ).result(30)

  def close(self):
    asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(30)
    self.loop.call_soon_threadsafe(self.loop.stop)
    self.thread.join(10)


def _config(tmp_path):
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.mesh.num_devices = 1
  cfg.rl.group_size, cfg.rl.oversample = 4, 1
  cfg.rl.drop_zero_variance = False  # a random policy: keep the all-wrong group anyway
  cfg.train.batch_prompts = 1
  cfg.rollout.engine = "sglang"
  cfg.rollout.sglang_urls = []
  cfg.rollout.staging_dir = str(tmp_path / "staging")
  cfg.rollout.health_interval_s = 0.2
  cfg.rollout.health_timeout_s = 2.0
  cfg.stages = [
    dict(
      name="s",
      steps=2,
      response_budget=24,
      max_turns=1,
      data="full",
      reset_optimizer=False,
      drop_solved_k_of_k=0,
    )
  ]
  return cfg


@pytest.mark.slow
def test_rl_through_the_real_router_survives_a_killed_worker(tmp_path):
  a = StandInProcess(str(tmp_path), "a", token_delay_s=0.02, vocab_size=1024).start()
  b = _ServerThread(vocab_size=1024, token_delay_s=0.02)
  router = None
  try:
    url_a = a.wait_ready()
    router = RouterProcess([url_a, b.server.url], log_path=str(tmp_path / "router.log")).start()
    router.wait_ready(expect_workers=2)
    cfg = _config(tmp_path)
    cfg.rollout.router_url = router.url
    problems = synthetic_tasks.generate(3, 4, families=["mul"], difficulty="easy")
    run = from_config_dict(cfg)
    tok = data_sources.ensure_tokenizer(
      run, str(tmp_path / "tok"), data_sources.tokenizer_corpus(problems)
    )
    learner = wiring.build_learner(run)
    killed = threading.Event()

    def kill_a_mid_step_2():  # once step 1 is done and A is generating a turn of step 2
      while not killed.is_set():
        if loop_ref and loop_ref[0].pos.rl_step >= 1 and a.running_requests() > 0:
          a.kill9()
          killed.set()
        threading.Event().wait(0.005)

    loop_ref = []

    async def main():
      engine = wiring.build_engine(run, learner.model_config, None, tok)
      async with wiring.open_runner(run, learner.model_config, None, tok, engine=engine) as runner:
        assert sorted(engine.urls) == sorted([url_a, b.server.url])  # from GET /workers
        loop = rl_loop.RLLoop(run, learner, runner, str(tmp_path / "run"), problems=problems)
        loop_ref.append(loop)
        watcher = threading.Thread(target=kill_a_mid_step_2, daemon=True)
        watcher.start()
        try:
          await loop.run()
        finally:
          killed.set()
          watcher.join(10)
          loop.ckpt.close()
        return loop, engine

    loop, engine = asyncio.run(main())
    assert not a.alive() and a.proc.returncode == -9  # really killed mid-run
    assert loop.pos.rl_step == 2
    recs = read_jsonl_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2] and all(r["num_trajectories"] == 4 for r in recs)
    # Both pushes reached B, the worker still alive; A is off the router and out of the pushes.
    assert str(b.server.weight_version) == "2" and len(b.server.weight_updates) == 2
    assert engine.urls == [b.server.url]
    assert engine.fleet_stats["failovers"] == 1
    assert [w["url"] for w in router.workers()] == [b.server.url]
    assert b.server.requests, "no turn reached B through the router"
  finally:
    if router is not None:
      router.stop()
    a.stop()
    b.close()
