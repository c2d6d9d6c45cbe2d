"""Rollout routing replay end to end on a tiny Qwen3-MoE (mixed dense / sparse layers): the
JaxSampler records each computed position's top-k experts per layer (prefill and decode), the
trajectory carries them, and the learner's forward with those routes forced reproduces the
engine's routing exactly (same weights): its own top-k equals the recorded set at every
recorded (token, layer), and its log-probs are the sampler's."""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.models import qwen3, qwen3_moe
from rstar_jax.models import routes as routes_lib
from rstar_jax.models.qwen3_config import Qwen3MoeConfig
from rstar_jax.rl import losses
from rstar_jax.rollout.jax_sampler import JaxSampler
from rstar_jax.rollout.types import GenerateRequest, SamplingParams

CONFIG = Qwen3MoeConfig(
  vocab_size=64,
  hidden_size=32,
  intermediate_size=40,
  moe_intermediate_size=16,
  num_hidden_layers=3,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=8,
  num_experts=6,
  num_experts_per_tok=2,
  mlp_only_layers=(1,),
  moe_implementation="dense",
)
fwd = jax.jit(qwen3_moe.forward, static_argnames=("config", "return_aux"))
pytestmark = pytest.mark.slow  # ~75 s on the shared 2-core CI machine (compiles dominate)


@pytest.fixture(scope="module")
def generated():
  """Two turns of one trajectory through a leased JaxSampler (the second turn reuses the
  first's cache and prefills only its appended tokens), routes on."""
  params = qwen3.init_params(CONFIG, jax.random.key(0))
  eng = JaxSampler(
    CONFIG, params, max_batch=2, max_len=64, page_size=8, decode_chunk=4, return_routes=True
  )
  prompt = [3, 9, 27, 17, 51, 1, 8, 33, 12, 40]

  async def run():
    async with eng.trajectory_lease("t"):
      (a,) = await eng.generate([GenerateRequest(prompt, SamplingParams(7, seed=1), rid="t:0")])
      turn2 = prompt + a.output_ids + [5, 6, 7]  # a "tool turn" appended
      (b,) = await eng.generate([GenerateRequest(turn2, SamplingParams(6, seed=2), rid="t:1")])
    return a, b, turn2

  a, b, turn2 = asyncio.run(run())
  return params, prompt, a, b, turn2


def test_sampler_reports_the_positions_it_computed(generated):
  params, prompt, a, b, turn2 = generated
  L, k = CONFIG.num_hidden_layers, CONFIG.num_experts_per_tok
  # Turn 1: everything prefilled (positions 0 .. P-2) then decode (P-1 .. P+n-2).
  assert a.routes_start == 0 and a.routes.shape == (len(prompt) + len(a.output_ids) - 1, L, k)
  # Turn 2 reuses the kept cache: routes from the first position it computed again.
  assert b.prefill_tokens < len(turn2)
  assert b.routes_start == len(turn2) - b.prefill_tokens
  assert b.routes_start + len(b.routes) == len(turn2) + len(b.output_ids) - 1
  for r in (a.routes, b.routes):
    assert (r[:, 1] == routes_lib.NO_ROUTE).all()  # the dense layer
    assert (r[:, [0, 2]] >= 0).all() and (r < CONFIG.num_experts).all()


def test_forced_routes_reproduce_the_engine_routing_and_logprobs(generated):
  params, prompt, a, b, turn2 = generated
  seq = turn2 + b.output_ids
  routes = routes_lib.empty_routes(len(seq), routes_lib.layout_of(CONFIG).shape)
  routes_lib.write_routes(routes, a.routes_start, a.routes)
  routes_lib.write_routes(routes, b.routes_start, b.routes)
  ids = jnp.asarray([seq], jnp.int32)
  logits, aux = fwd(params, CONFIG, ids, routes=jnp.asarray(routes[None]), return_aux=True)
  recorded = routes_lib.has_route(routes)
  assert recorded[:-1].all() and not recorded[-1]  # every position but the last
  # Same weights: the learner's own top-k IS the engine's set at every recorded position.
  own = np.sort(np.asarray(aux.topk[0]), -1)
  np.testing.assert_array_equal(own[recorded][:, [0, 2]], np.sort(routes[recorded], -1)[:, [0, 2]])
  sums = routes_lib.agreement_sums(aux.topk, jnp.asarray(routes[None]), jnp.ones((1, len(seq))))
  assert float(losses.reduce_metrics(sums)["routing/agree"]) == 1.0
  # And the replayed forward's log-probs are the sampler's (f32, same weights).
  lp = jax.nn.log_softmax(logits[0], -1)
  got = [float(lp[len(turn2) - 1 + i, t]) for i, t in enumerate(b.output_ids)]
  np.testing.assert_allclose(got, b.logprobs, atol=2e-4)


def test_replayed_routes_change_a_perturbed_learner(generated):
  """A learner whose router drifted (other weights) routes some tokens elsewhere on its own;
  with the engine's routes forced, every recorded token uses the engine's set."""
  params, prompt, a, b, turn2 = generated
  seq = prompt + a.output_ids
  routes = routes_lib.empty_routes(len(seq), (CONFIG.num_hidden_layers, CONFIG.num_experts_per_tok))
  routes_lib.write_routes(routes, a.routes_start, a.routes)
  drift = jax.tree.map(lambda x: x, params)
  gate = drift["moe"]["gate"]["kernel"]
  drift["moe"]["gate"]["kernel"] = gate + 0.5 * jax.random.normal(jax.random.key(7), gate.shape)
  ids = jnp.asarray([seq], jnp.int32)
  _, free = fwd(drift, CONFIG, ids, return_aux=True)
  _, forced = fwd(drift, CONFIG, ids, routes=jnp.asarray(routes[None]), return_aux=True)
  mask = jnp.ones((1, len(seq)))
  agree = losses.reduce_metrics(
    routes_lib.agreement_sums(free.topk, jnp.asarray(routes[None]), mask)
  )
  assert float(agree["routing/agree"]) < 1.0  # the drifted router disagrees somewhere
  used = np.asarray(forced.routes[0])
  rec = routes_lib.has_route(routes)
  np.testing.assert_array_equal(
    np.sort(used[rec][:, [0, 2]], -1), np.sort(routes[rec][:, [0, 2]], -1)
  )
