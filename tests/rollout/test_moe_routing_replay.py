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


def test_jitted_learner_steps_replay_the_trajectory_routes(generated):
  """make_jitted_steps on the MoE config with routing replay: the batch built from the
  trajectory's routes gives the sampler's log-probs and full agreement in the RL step."""
  import optax

  from rstar_jax.learner import batch as batch_lib
  from rstar_jax.learner import steps
  from rstar_jax.learner.train_state import TrainState
  from rstar_jax.rollout.types import Trajectory
  from rstar_jax.sharding import make_mesh

  params, prompt, a, b, turn2 = generated
  resp = turn2[len(prompt) :] + b.output_ids
  mask = [1] * len(a.output_ids) + [0, 0, 0] + [1] * len(b.output_ids)
  logp = a.logprobs + [0.0] * 3 + b.logprobs
  routes = routes_lib.empty_routes(len(prompt) + len(resp), (3, 2))
  routes_lib.write_routes(routes, a.routes_start, a.routes)
  routes_lib.write_routes(routes, b.routes_start, b.routes)
  traj = Trajectory(prompt, resp, mask, logp, [0] * len(resp), 2, [], "stop", routes=routes)
  batch = batch_lib.make_rl_batch([traj, traj], [1.0, -1.0], 64)
  tx = optax.sgd(1e-3)
  mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
  js = steps.make_jitted_steps(CONFIG, mesh, tx=tx, config=steps.StepConfig(routing_replay=True))
  lp = np.asarray(js.compute_logprobs(params, js.shard_batch(batch)))
  m = batch["loss_mask"] > 0
  np.testing.assert_allclose(lp[m], batch[batch_lib.SAMPLER_KEY][m], atol=2e-4)
  inputs, _ = steps.step_inputs(batch, js.config, lp)
  state = js.shard_state(TrainState.create(jax.tree.map(jnp.copy, params), tx, 0))  # donated
  _, metrics = js.rl_step(state, js.shard_batch(inputs))
  assert float(metrics["routing/agree"]) == 1.0
  assert float(metrics["routing/agree_layer0"]) == float(metrics["routing/agree_layer2"]) == 1.0
  assert "routing/agree_layer1" not in metrics  # the dense layer
  assert float(metrics["ratio_mean"]) == pytest.approx(1.0, abs=1e-5)
  # The RL loop's ratio metrics with and without replay (rl.routing_metrics): with the same
  # weights both are ~1; with a drifted router only the replayed forward stays near the sampler.
  import types

  from rstar_jax.pipelines.rl_loop import RLLoop

  gate = params["moe"]["gate"]["kernel"]
  drift = dict(
    params,
    moe=dict(
      params["moe"], gate={"kernel": gate + 0.5 * jax.random.normal(jax.random.key(7), gate.shape)}
    ),
  )
  for p, same in ((params, True), (drift, False)):
    loop = types.SimpleNamespace(
      learner=types.SimpleNamespace(jitted=js, state=types.SimpleNamespace(params=p)),
      config=types.SimpleNamespace(rl=types.SimpleNamespace(routing_metrics=True)),
    )
    got = RLLoop.routing_ratio_metrics(loop, batch, RLLoop.routing_logprobs(loop, batch, None))
    assert set(got) == {
      f"routing/{m}/{s}"
      for m in ("replay", "no_replay")
      for s in ("is_ratio_mean", "is_ratio_max", "is_ratio_min", "abs_log_ratio_mean")
    }
    if same:
      assert got["routing/replay/abs_log_ratio_mean"] < 1e-3
      assert got["routing/no_replay/abs_log_ratio_mean"] < 1e-3
    else:
      assert got["routing/no_replay/abs_log_ratio_mean"] != got["routing/replay/abs_log_ratio_mean"]
  # The RL loop's update (what a MoE demo's RL step runs): a batch carrying the engine's routes
  # gets the ratio metrics beside the step's own, from the weights before the update.
  upd = types.SimpleNamespace(
    learner=types.SimpleNamespace(
      jitted=js, state=js.shard_state(TrainState.create(jax.tree.map(jnp.copy, drift), tx, 0))
    ),
    config=types.SimpleNamespace(
      rl=types.SimpleNamespace(
        recompute_old_logprobs=False,
        routing_metrics=True,
        routing_outlier_band=1e6,  # the outlier check runs; no token is that far out
        ppo_mini_batches=1,
        ppo_epochs=1,
      )
    ),
    source=types.SimpleNamespace(off_policy=False),
  )
  upd.routing_logprobs = lambda b, p: RLLoop.routing_logprobs(upd, b, p)
  upd.routing_ratio_metrics = lambda b, lps: RLLoop.routing_ratio_metrics(upd, b, lps)
  upd.routing_outliers = lambda b, lps, labels: RLLoop.routing_outliers(upd, b, lps, labels)
  metrics = RLLoop.update(upd, batch, seed=0)
  assert metrics["routing/no_replay/abs_log_ratio_mean"] == pytest.approx(
    got["routing/no_replay/abs_log_ratio_mean"], rel=1e-5
  )
  assert metrics["routing/outlier_tokens"] == 0 and metrics["routing/outlier_checked"] > 0
  assert "routing/agree" in metrics and metrics["ppo_updates"] == 1.0  # the step's own metrics
