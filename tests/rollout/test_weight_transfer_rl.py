"""The RL loop pushes through each weight transport to the SGLang stand-in: two tiny steps, then
the server's tensors equal the learner's params byte for byte and push/* metrics are logged."""

import asyncio

import jax
import numpy as np
import pytest

from configs import rstar2_tiny_cpu
from rstar_jax.config import from_config_dict
from rstar_jax.data import synthetic_tasks
from rstar_jax.models import qwen3_hf_layout as layout
from rstar_jax.pipelines import data_sources, rl_loop, wiring
from rstar_jax.pipelines.metrics_log import read_jsonl_metrics
from rstar_jax.rollout.testing.mock_sglang import MockSGLangServer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
  problems = synthetic_tasks.generate(3, 4, families=["mul"], difficulty="easy")
  cfg = rstar2_tiny_cpu.get_config("rl")
  d = str(tmp_path_factory.mktemp("tok"))
  return problems, data_sources.ensure_tokenizer(
    from_config_dict(cfg), d, data_sources.tokenizer_corpus(problems)
  )


@pytest.mark.slow
@pytest.mark.parametrize(
  "transport,delta", [("disk", False), ("tensor", True), ("distributed", True)]
)
def test_rl_loop_pushes_through_transport(transport, delta, tmp_path, tok_dir):
  problems, tok = tok_dir
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.mesh.num_devices = 1
  cfg.rl.group_size, cfg.rl.oversample = 2, 1
  cfg.rl.drop_zero_variance = False  # a random policy: keep the all-wrong group anyway
  cfg.train.batch_prompts = 1
  cfg.train.eval_every = 0
  cfg.rollout.engine = "sglang"
  cfg.rollout.weight_transport = transport
  cfg.rollout.weight_delta = delta
  cfg.rollout.colocated = transport == "tensor"
  cfg.rollout.staging_dir = str(tmp_path / "staging")
  cfg.stages = [
    dict(
      name="s",
      steps=2,
      response_budget=8,
      max_turns=1,
      data="full",
      reset_optimizer=False,
      drop_solved_k_of_k=0,
    )
  ]
  learner = wiring.build_learner(from_config_dict(cfg))

  async def main():
    async with MockSGLangServer(vocab_size=1024) as server:
      cfg.rollout.sglang_urls = [server.url]
      run = from_config_dict(cfg)
      assert (run.rollout.weight_transport, run.rollout.weight_delta) == (transport, delta)
      async with wiring.open_runner(run, learner.model_config, None, tok) as runner:
        assert runner.engine.transport.name == transport
        loop = rl_loop.RLLoop(run, learner, runner, str(tmp_path), problems=problems[:1])
        await loop.run()
        loop.ckpt.close()
      return server

  server = asyncio.run(main())
  assert server.weight_version == "2"
  host = jax.tree.map(np.asarray, jax.device_get(learner.state.params))
  for t in layout.hf_table(learner.model_config):
    want = np.ascontiguousarray(layout.to_hf(layout.get_leaf(host, t.path), t))
    assert server.weights[t.name].tobytes() == want.tobytes(), t.name
  recs = [r for r in read_jsonl_metrics(str(tmp_path / "metrics.jsonl")) if "push/bytes" in r]
  assert len(recs) == 2 and all(r["push/seconds"] > 0 for r in recs)
  assert recs[0]["push/delta_fraction"] == 1.0 and recs[0]["push/bytes"] > 0
  if transport == "tensor":
    assert [e[0] for e in server.memory_events] == ["release", "resume"] * 2
