"""rl_step with truncated importance sampling (StepConfig.tis_cap): the sampler's log-probs
(behaviour_logprobs) re-weight the clipped surrogate built on the learner's old_logprobs."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from learner_toy_model import toy_apply, toy_batch, toy_params

from rstar_jax.learner import optim, steps
from rstar_jax.learner.train_state import TrainState

OPT = optim.OptimConfig(lr=1e-2, warmup_steps=2)


def _state():
  return TrainState.create(toy_params(0), optim.make_optimizer(OPT), 0)


def _ref_tis_loss(params, batch, cap, eps_low=0.2, eps_high=0.28, mode="tis"):
  logits = toy_apply(params, batch["input_ids"], batch["attention_mask"])
  lsm = jax.nn.log_softmax(logits[:, :-1], -1)
  lp = jnp.pad(
    jnp.take_along_axis(lsm, batch["input_ids"][:, 1:, None], -1)[..., 0], ((0, 0), (1, 0))
  )
  m = batch["loss_mask"].at[:, 0].set(0)
  ratio = jnp.exp(lp - batch["old_logprobs"])
  rho = jnp.exp(batch["old_logprobs"] - batch["behaviour_logprobs"])
  w = jnp.minimum(rho, cap) if mode == "tis" else jnp.where(rho > cap, 0.0, rho)
  a = batch["advantages"][:, None]
  per = -jnp.minimum(a * ratio, a * jnp.clip(ratio, 1 - eps_low, 1 + eps_high))
  return jnp.sum(w * per * m) / jnp.sum(m)


def _batch(noise):
  b = toy_batch(1)
  rng = np.random.default_rng(5)
  b["behaviour_logprobs"] = (
    b["old_logprobs"] + noise * rng.normal(size=b["old_logprobs"].shape).astype(np.float32)
  ) * b["loss_mask"]
  return jax.tree.map(jnp.asarray, b)


@pytest.mark.parametrize("m,mode", [(1, "tis"), (4, "tis"), (2, "decoupled_ppo")])
def test_off_policy_step_matches_reference(m, mode):
  """The learner selects the off-policy loss by registry name (StepConfig.off_policy_loss)."""
  batch = _batch(0.7)
  state = _state()
  ref = functools.partial(_ref_tis_loss, cap=2.0, mode=mode)
  grads = jax.jit(jax.grad(ref))(state.params, batch)
  want = state.apply_gradients(grads).params
  cfg = steps.StepConfig(num_micro_batches=m, optim=OPT, tis_cap=2.0, off_policy_loss=mode)
  got, metrics = jax.jit(functools.partial(steps.rl_step, apply_fn=toy_apply, config=cfg))(
    _state(), batch
  )
  chex.assert_trees_all_close(got.params, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(metrics["loss"], ref(toy_params(0), batch), rtol=1e-5)
  assert 0.0 < float(metrics["is_capped_frac"]) < 1.0


def test_tis_with_behaviour_equal_old_is_todays_step():
  batch = _batch(0.0)
  plain, m0 = steps.rl_step(_state(), batch, apply_fn=toy_apply, config=steps.StepConfig(optim=OPT))
  tis, m1 = steps.rl_step(
    _state(), batch, apply_fn=toy_apply, config=steps.StepConfig(optim=OPT, tis_cap=2.0)
  )
  chex.assert_trees_all_equal(plain.params, tis.params)
  assert float(m1["is_weight_mean"]) == 1.0
  for k in m0:
    np.testing.assert_array_equal(np.asarray(m0[k]), np.asarray(m1[k]), err_msg=k)


def test_tis_needs_behaviour_logprobs_and_valid_cap():
  batch = jax.tree.map(jnp.asarray, toy_batch(1))
  with pytest.raises(ValueError, match="behaviour_logprobs"):
    steps.rl_step(_state(), batch, apply_fn=toy_apply, config=steps.StepConfig(tis_cap=2.0))
  with pytest.raises(ValueError, match="StepConfig.tis_cap"):
    steps.StepConfig(tis_cap=0.5)
  with pytest.raises(ValueError, match="StepConfig.off_policy_loss"):
    steps.StepConfig(tis_cap=2.0, off_policy_loss="nope")
