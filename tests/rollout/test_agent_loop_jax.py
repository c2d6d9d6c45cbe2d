"""The agent loop driving the embedded JaxSampler on a tiny random model (integration)."""

import asyncio

import jax
import numpy as np
from rollout_helpers import FakePool

from rstar_jax.models import qwen3
from rstar_jax.rollout import JaxSampler
from rstar_jax.rollout.agent_loop import RolloutSettings, run_agent_loop
from rstar_jax.tokenization import chat_format as cf


def test_agent_loop_with_jax_sampler(tokenizer):
  cfg = qwen3.Qwen3Config(
    vocab_size=len(tokenizer),
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    max_position_embeddings=4096,
  )
  params = qwen3.init_params(cfg, jax.random.PRNGKey(1))
  prompt_len = len(cf.prompt_ids(tokenizer, "rstar2", "q0"))
  budget = 12
  engine = JaxSampler(
    cfg,
    params,
    max_batch=4,
    max_len=prompt_len + budget + 8,
    prefill_buckets=(prompt_len + 8,),
    decode_chunk=8,
  )
  loop_cfg = RolloutSettings(response_budget=budget, seed=0)

  async def main():
    a = await run_agent_loop(engine, tokenizer, FakePool(), ["q0", "q1"], 2, loop_cfg)
    await engine.update_weights(cfg, params, 7)
    b = await run_agent_loop(engine, tokenizer, FakePool(), ["q0", "q1"], 2, loop_cfg)
    return a, b

  a, b = asyncio.run(main())
  for t in a + b:
    assert t.finish_reason in ("stop", "length") and 1 <= len(t.response_ids) <= budget
    gen = [lp for lp, m in zip(t.logprobs, t.loss_mask) if m]
    assert all(lp < 0 for lp in gen) and all(0 <= i < len(tokenizer) for i in t.response_ids)
  assert {v for t in a for v in t.weight_versions} == {0}
  assert {v for t in b for v in t.weight_versions} == {7}
  # seeded turns: same (seed, problem, sample, turn) -> same tokens after the weight swap
  assert [t.response_ids for t in a] == [t.response_ids for t in b]
  for ta, tb in zip(a, b):
    np.testing.assert_allclose(ta.logprobs, tb.logprobs, rtol=1e-5, atol=1e-6)
