"""The JaxSampler decodes a Qwen3-MoE model (paged KV cache, sparse layers through the same
MoE layer): greedy tokens and their log-probs equal the full forward's."""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.models import qwen3, qwen3_moe
from rstar_jax.rollout.jax_sampler import JaxSampler
from rstar_jax.rollout.types import GenerateRequest, SamplingParams

CFG = qwen3_moe.Qwen3MoeConfig(
  vocab_size=64,
  hidden_size=32,
  intermediate_size=48,
  moe_intermediate_size=16,
  num_hidden_layers=3,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=8,
  num_experts=4,
  num_experts_per_tok=2,
  mlp_only_layers=(1,),
  norm_topk_prob=True,
)


@pytest.mark.slow  # ~1.5 min on a loaded 2-core machine (compiles prefill, decode and forward)
def test_greedy_decode_matches_full_forward():
  params = qwen3.init_params(CFG, jax.random.key(0))
  params["moe"]["gate"]["kernel"] = params["moe"]["gate"]["kernel"] * 50  # routing matters
  params["lm_head"]["kernel"] = params["lm_head"]["kernel"] * 50  # a clear greedy argmax
  eng = JaxSampler(CFG, params, max_batch=2, max_len=32, page_size=8, decode_chunk=4)
  prompts = [[3, 9, 27, 17, 5], [11, 2]]
  sp = SamplingParams(6, temperature=0.0)
  results = asyncio.run(eng.generate([GenerateRequest(p, sp) for p in prompts]))
  fwd = jax.jit(qwen3_moe.forward, static_argnames=("config", "return_aux"))
  for prompt, res in zip(prompts, results):
    seq = list(prompt)
    want_lp = []
    for _ in range(6):
      logp = jax.nn.log_softmax(fwd(params, CFG, jnp.asarray([seq]))[0, -1])
      seq.append(int(jnp.argmax(logp)))
      want_lp.append(float(logp[seq[-1]]))
    assert list(res.output_ids) == seq[len(prompt) :]
    np.testing.assert_allclose(res.logprobs, want_lp, atol=1e-4)
