"""Routing replay in the learner steps, on a toy MoE-like model: the batch's routes reach the
forward (RL step across micro-batches, and old log-probs) only under StepConfig.routing_replay,
and the step reports router agreement from the forward's own top-k either way."""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from learner_toy_model import T, V, toy_batch

from rstar_jax.learner import optim, steps
from rstar_jax.learner.train_state import TrainState
from rstar_jax.models import routes as routes_lib
from rstar_jax.rl import losses

D, E, L, K = 8, 4, 2, 2  # layer 1 is "dense": its route row is -1


class Aux(NamedTuple):
  topk: jax.Array


def toy_moe_apply(params, ids, mask, segment_ids=None, positions=None, routes=None):
  """Embedding + one routed layer (layer 0) whose gate weights come from its own router
  softmax at the experts used (forced where ``routes`` has a recorded row)."""
  h = params["emb"][ids] * mask[..., None]
  scores = h @ params["router"]  # [B, T, E]
  own = jax.lax.top_k(scores, K)[1]
  used = own
  if routes is not None:
    r0 = routes[:, :, 0]
    used = jnp.where((r0 >= 0).all(-1, keepdims=True), r0, own)
  gate = jnp.take_along_axis(jax.nn.softmax(scores, -1), used, -1)  # [B, T, K]
  y = jnp.einsum("btk,btkd->btd", gate, params["experts"][used])
  logits = jnp.tanh(jnp.cumsum(h + y, 1)) @ params["emb"].T
  topk = jnp.stack([own, jnp.full_like(own, -1)], 2)  # [B, T, L, K]
  return logits, Aux(topk)


def _params(seed=0):
  k = jax.random.split(jax.random.key(seed), 3)
  return {
    "emb": jax.random.normal(k[0], (V, D)),
    "router": jax.random.normal(k[1], (D, E)),
    "experts": jax.random.normal(k[2], (E, D)),
  }


def _batch(seed=0):
  b = toy_batch(seed)
  rng = np.random.default_rng(seed + 1)
  routes = np.stack([rng.permutation(E)[:K] for _ in range(b["input_ids"].size)])
  routes = routes.reshape(b["input_ids"].shape + (1, K)).astype(np.int32)
  routes = np.concatenate([routes, np.full_like(routes, -1)], 2)  # [N, T, L, K]
  routes[:, ::3] = -1  # some tokens without a recorded route
  b["routes"] = routes
  return jax.tree.map(jnp.asarray, b)


def _state():
  return TrainState.create(_params(), optim.make_optimizer(optim.OptimConfig(lr=1e-2)), 0)


def _forced(routes):
  """Reference apply_fn with the routes baked in."""
  return lambda p, ids, mask, **kw: toy_moe_apply(p, ids, mask, routes=routes)


def _unforced(p, ids, mask, **kw):
  return toy_moe_apply(p, ids, mask)


def test_replay_forces_the_batch_routes_in_the_step_and_old_logprobs():
  m = 2  # strided micro-batches: each sees its own rows' routes
  batch = _batch()
  cfg = steps.StepConfig(num_micro_batches=m, routing_replay=True)
  s1, got = steps.rl_step(_state(), batch, apply_fn=toy_moe_apply, config=cfg)
  ref_batch = {k: v for k, v in batch.items() if k != "routes"}
  s2, want = steps.rl_step(
    _state(), ref_batch, apply_fn=_forced(batch["routes"]), config=steps.StepConfig()
  )
  np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), s1.params, s2.params
  )
  lp = steps.compute_logprobs(_params(), batch, apply_fn=toy_moe_apply, num_micro_batches=m)
  lp_ref = steps.compute_logprobs(_params(), ref_batch, apply_fn=_forced(batch["routes"]))
  np.testing.assert_allclose(lp, lp_ref, rtol=1e-5, atol=1e-6)
  # The replay changes the forward: the learner's own routing gives other log-probs.
  lp_own = steps.compute_logprobs(_params(), ref_batch, apply_fn=_unforced)
  assert float(jnp.abs(lp - lp_own).max()) > 1e-3


def test_without_replay_routes_only_feed_the_agreement_metric():
  batch = _batch(1)
  ref_batch = {k: v for k, v in batch.items() if k != "routes"}
  _, got = steps.rl_step(_state(), batch, apply_fn=toy_moe_apply, config=steps.StepConfig())
  _, want = steps.rl_step(_state(), ref_batch, apply_fn=_unforced, config=steps.StepConfig())
  np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-6)
  own = toy_moe_apply(_params(), batch["input_ids"], batch["attention_mask"])[1].topk
  sums = routes_lib.agreement_sums(own, batch["routes"], batch["attention_mask"])
  np.testing.assert_allclose(
    got["routing/agree"], losses.reduce_metrics(sums)["routing/agree"], rtol=1e-6
  )
  assert 0.0 <= float(got["routing/agree"]) < 1.0  # random routes: some disagree
  assert "routing/agree" not in want  # nothing to compare without routes


def test_replay_under_jit_and_a_bad_routes_shape():
  batch = _batch(2)
  cfg = steps.StepConfig(num_micro_batches=2, routing_replay=True)
  step = jax.jit(functools.partial(steps.rl_step, apply_fn=toy_moe_apply, config=cfg))
  _, m = step(_state(), batch)
  _, ref = steps.rl_step(_state(), batch, apply_fn=toy_moe_apply, config=cfg)
  np.testing.assert_allclose(m["loss"], ref["loss"], rtol=1e-5)
  bad = dict(batch, routes=batch["routes"][:, : T - 1])
  with pytest.raises(ValueError, match=r"batch\['routes'\]: expected shape"):
    steps.rl_step(_state(), bad, apply_fn=toy_moe_apply, config=cfg)
