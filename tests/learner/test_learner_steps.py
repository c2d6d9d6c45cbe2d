"""Pure learner steps on a toy causal model: exact token-mean, micro-batching, loss values."""

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


def _state(seed=0):
  return TrainState.create(toy_params(seed), optim.make_optimizer(OPT), 0)


def _ref_logp(params, batch):
  """Independent token log-probs: log_softmax at t-1 gathered at ids[t]."""
  logits = toy_apply(params, batch["input_ids"], batch["attention_mask"])
  lsm = jax.nn.log_softmax(logits[:, :-1], -1)
  lp = jnp.take_along_axis(lsm, batch["input_ids"][:, 1:, None], -1)[..., 0]
  return jnp.pad(lp, ((0, 0), (1, 0)))


def _ref_sft_loss(params, batch):
  m = batch["loss_mask"]
  return -jnp.sum(_ref_logp(params, batch) * m) / jnp.sum(m)


def _ref_rl_loss(params, batch, eps_low=0.2, eps_high=0.28):
  m = batch["loss_mask"]
  ratio = jnp.exp(_ref_logp(params, batch) - batch["old_logprobs"])
  a = batch["advantages"][:, None]
  per = -jnp.minimum(a * ratio, a * jnp.clip(ratio, 1 - eps_low, 1 + eps_high))
  return jnp.sum(per * m) / jnp.sum(m)


def _expected_params(ref_loss, batch):
  state = _state()
  grads = jax.jit(jax.grad(ref_loss))(state.params, batch)
  return state.apply_gradients(grads).params, grads


class StepTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_sft_step_is_whole_batch_token_mean(self):
    batch = jax.tree.map(jnp.asarray, toy_batch())
    want_params, want_grads = _expected_params(_ref_sft_loss, batch)
    for m in (1, 2, 4):
      cfg = steps.StepConfig(num_micro_batches=m, optim=OPT)
      step = self.variant(functools.partial(steps.sft_step, apply_fn=toy_apply, config=cfg))
      state, metrics = step(_state(), batch)
      chex.assert_trees_all_close(state.params, want_params, rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(metrics["loss"], _ref_sft_loss(toy_params(), batch), rtol=1e-5)
      np.testing.assert_allclose(metrics["grad_norm"], optax_norm(want_grads), rtol=1e-5)
      assert float(metrics["num_tokens"]) == float(batch["loss_mask"].sum())
      assert float(metrics["learning_rate"]) == pytest.approx(OPT.lr / 2)
      assert int(state.step) == 1

  @chex.variants(with_jit=True, without_jit=True)
  def test_rl_step_is_whole_batch_clipped_surrogate(self):
    batch = jax.tree.map(jnp.asarray, toy_batch(1))
    want_params, _ = _expected_params(_ref_rl_loss, batch)
    results = []
    for m in (1, 4):
      cfg = steps.StepConfig(num_micro_batches=m, optim=OPT)
      step = self.variant(functools.partial(steps.rl_step, apply_fn=toy_apply, config=cfg))
      state, metrics = step(_state(), batch)
      chex.assert_trees_all_close(state.params, want_params, rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(metrics["loss"], _ref_rl_loss(toy_params(), batch), rtol=1e-5)
      results.append(metrics)
    # Micro-batched metrics are the same exact ratios as the whole-batch ones.
    for r in results[1:]:
      chex.assert_trees_all_close(r, results[0], rtol=1e-5, atol=1e-7)


def optax_norm(tree):
  return jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(tree)))


def test_micro_batches_with_unequal_token_counts_keep_exact_mean():
  # Micro-batch 0 (rows 0, 4) keeps all its tokens, the others one token per row: a
  # per-micro-batch mean would over-weight those few tokens and change the gradient.
  batch = toy_batch(2)
  for r in range(len(batch["loss_mask"])):
    if r % 4:
      keep = np.flatnonzero(batch["loss_mask"][r])[:1]
      batch["loss_mask"][r] = 0
      batch["loss_mask"][r, keep] = 1
  batch = jax.tree.map(jnp.asarray, batch)
  want_params, want_grads = _expected_params(_ref_sft_loss, batch)
  cfg = steps.StepConfig(num_micro_batches=4)
  state, metrics = jax.jit(functools.partial(steps.sft_step, apply_fn=toy_apply, config=cfg))(
    _state(), batch
  )
  chex.assert_trees_all_close(state.params, want_params, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(metrics["grad_norm"], optax_norm(want_grads), rtol=1e-5)


def test_recomputed_old_logprobs_give_ratio_one():
  batch = jax.tree.map(jnp.asarray, toy_batch(3))
  for m in (1, 4):
    logp = jax.jit(
      functools.partial(steps.compute_logprobs, apply_fn=toy_apply, num_micro_batches=m)
    )(toy_params(), batch)
    np.testing.assert_allclose(logp, _ref_logp(toy_params(), batch), rtol=1e-5, atol=1e-6)
    fresh = steps.with_old_logprobs(batch, logp)
    assert float(jnp.abs(fresh["old_logprobs"] * (1 - batch["loss_mask"])).max()) == 0.0
    _, metrics = steps.rl_step(
      _state(), fresh, apply_fn=toy_apply, config=steps.StepConfig(num_micro_batches=m)
    )
    np.testing.assert_allclose(metrics["ratio_mean"], 1.0, rtol=1e-6)
    assert float(metrics["clip_frac"]) == 0.0


def test_learner_logprobs_are_token_aligned():
  # logits[:, t] predicts ids[:, t + 1]; the learner's log-prob of column t is about ids[:, t]
  # (column 0 is never a target), with the one rl.losses.token_logprobs_and_entropy inside.
  logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [1 / 3] * 3]]))
  ids = jnp.array([[2, 0, 2]])
  batch = {"input_ids": ids, "attention_mask": jnp.ones_like(ids)}
  apply = lambda params, input_ids, attention_mask: logits
  logp = steps.compute_logprobs(None, batch, apply_fn=apply)
  np.testing.assert_allclose(logp, [[0.0, np.log(0.5), np.log(0.8)]], rtol=1e-6)
  lp, ent = steps._token_aligned(logits, ids)
  np.testing.assert_allclose(lp, logp)
  h = lambda p: -sum(x * np.log(x) for x in p)
  np.testing.assert_allclose(ent, [[0.0, h([0.5, 0.25, 0.25]), h([0.1, 0.1, 0.8])]], rtol=1e-6)


def test_bad_batch_and_config_errors():
  batch = toy_batch()
  del batch["advantages"]
  with pytest.raises(ValueError, match=r"missing \['advantages'\]"):
    steps.rl_step(_state(), batch, apply_fn=toy_apply)
  batch = toy_batch()
  batch["old_logprobs"] = batch["old_logprobs"][:, :-1]
  with pytest.raises(ValueError, match=r"batch\['old_logprobs'\]: expected shape \(8, 7\)"):
    steps.rl_step(_state(), batch, apply_fn=toy_apply)
  with pytest.raises(ValueError, match="not a multiple of num_micro_batches=3"):
    steps.sft_step(
      _state(), toy_batch(), apply_fn=toy_apply, config=steps.StepConfig(num_micro_batches=3)
    )
  with pytest.raises(ValueError, match="StepConfig.num_micro_batches"):
    steps.StepConfig(num_micro_batches=0)


def test_seq_mean_aggregation_exact_under_micro_batching():
  batch = jax.tree.map(jnp.asarray, toy_batch(4))
  mask = batch["loss_mask"]

  def ref(params):  # mean over rows that have tokens of each row's token-mean
    ratio = jnp.exp(_ref_logp(params, batch) - batch["old_logprobs"])
    a = batch["advantages"][:, None]
    per = -jnp.minimum(a * ratio, a * jnp.clip(ratio, 0.8, 1.28))
    cnt = mask.sum(-1)
    row = (per * mask).sum(-1) / jnp.maximum(cnt, 1)
    return jnp.sum(row) / jnp.sum(cnt > 0)

  state = _state()
  want = state.apply_gradients(jax.jit(jax.grad(ref))(state.params)).params
  for m in (1, 4):
    cfg = steps.StepConfig(num_micro_batches=m, agg="seq-mean-token-mean")
    got, metrics = jax.jit(functools.partial(steps.rl_step, apply_fn=toy_apply, config=cfg))(
      _state(), batch
    )
    chex.assert_trees_all_close(got.params, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["loss"], ref(toy_params()), rtol=1e-5)


@pytest.mark.parametrize(
  "field,value", [("policy_loss", "nope"), ("dual_clip_c", 1.0), ("agg", "sum"), ("eps_low", 1.0)]
)
def test_step_config_errors_name_field(field, value):
  with pytest.raises(ValueError, match=f"StepConfig.{field}"):
    steps.StepConfig(**{field: value})


def test_logprob_drift_values():
  mask = jnp.array([[0, 1, 1, 0], [1, 1, 0, 0]], jnp.float32)  # column 0 is never a target
  a = jnp.array([[9.0, -1.0, -2.0, 5.0], [9.0, -0.5, 7.0, 7.0]])
  b = jnp.array([[0.0, -1.5, -1.0, 0.0], [0.0, -0.5, 0.0, 0.0]])
  d = steps.logprob_drift(a, b, mask)
  np.testing.assert_allclose(d["logprob_abs_diff"], (0.5 + 1.0 + 0.0) / 3, rtol=1e-6)
  np.testing.assert_allclose(d["logprob_max_abs_diff"], 1.0, rtol=1e-6)
  np.testing.assert_allclose(d["logprob_diff"], (-0.5 + 1.0 + 0.0) / 3, rtol=1e-6)
