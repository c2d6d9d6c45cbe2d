"""Optimizer config, LR schedule, AdamW+clip update against a numpy reference, optimizer reset."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.learner import optim
from rstar_jax.learner.train_state import TrainState, reset_optimizer


def test_constant_schedule_warmup_values():
  cfg = optim.OptimConfig(lr=2e-3, warmup_steps=4)
  sched = optim.make_schedule(cfg)
  got = [float(sched(k)) for k in range(7)]
  want = [2e-3 * min(1.0, (k + 1) / 4) for k in range(7)]
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_no_warmup_starts_at_peak():
  sched = optim.make_schedule(optim.OptimConfig(lr=0.5, warmup_steps=0))
  np.testing.assert_allclose([float(sched(k)) for k in range(3)], [0.5] * 3)


def test_cosine_schedule_values():
  cfg = optim.OptimConfig(
    lr=1.0, warmup_steps=2, schedule="cosine", total_steps=10, final_lr_ratio=0.1
  )
  sched = optim.make_schedule(cfg)
  got = np.array([float(sched(k)) for k in range(12)])
  # warm-up 0.5, 1.0; then decay over 8 updates: progress (k - 1) / 8 for k >= 2.
  want = [0.5, 1.0] + [
    0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * min(1.0, (k - 1) / 8))) for k in range(2, 12)
  ]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  assert got[9] == pytest.approx(0.1) and got[11] == pytest.approx(0.1)
  assert np.all(np.diff(got[1:]) <= 1e-7)  # monotone after the peak


@pytest.mark.parametrize(
  "field,value",
  [
    ("lr", 0.0),
    ("b1", 1.0),
    ("b2", -0.1),
    ("weight_decay", -1.0),
    ("grad_clip", -1.0),
    ("warmup_steps", -1),
    ("schedule", "linear"),
    ("final_lr_ratio", 2.0),
  ],
)
def test_bad_config_names_field(field, value):
  with pytest.raises(ValueError, match=f"config.optim.{field}:"):
    optim.OptimConfig(**{field: value})


def test_cosine_needs_total_steps():
  # 0 = "the loop sets it": accepted by the config, refused when the schedule is built.
  unset = optim.OptimConfig(schedule="cosine", warmup_steps=5)
  with pytest.raises(ValueError, match="optim.total_steps: expected > warmup_steps"):
    optim.make_optimizer(unset)
  assert optim.make_schedule(unset.learner_config(total_steps=6))(0) > 0
  with pytest.raises(ValueError, match="config.optim.total_steps"):
    optim.OptimConfig(schedule="cosine", warmup_steps=5, total_steps=5)


def test_one_optim_config_from_run_config_to_learner():
  """The run config's section is the learner's type: no field-by-field copy to drift."""
  from rstar_jax.config import RunConfig

  run = RunConfig(mode="sft", optim=optim.OptimConfig(lr=3e-4, grad_clip=0.0))
  assert optim.OptimConfig is type(run.optim)
  oc = run.optim.learner_config(total_steps=7)
  assert (oc.lr, oc.total_steps, oc.grad_clip) == (3e-4, 7, 0.0)
  # grad_clip 0 = no clipping transform in the chain (adamw alone).
  assert len(optim.make_optimizer(oc).init({"w": jnp.ones(2)})) == 1
  assert len(optim.make_optimizer(run.optim).init({"w": jnp.ones(2)})) == 1
  assert len(optim.make_optimizer(optim.OptimConfig()).init({"w": jnp.ones(2)})) == 2


def _numpy_adamw(params, grads_seq, cfg):
  """Reference: clip by global norm, Adam with bias correction, decoupled weight decay."""
  p = {k: np.array(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(x) for k, x in p.items()}
  for t, g in enumerate(grads_seq):
    g = {k: np.array(x, np.float64) for k, x in g.items()}
    norm = np.sqrt(sum(np.sum(x**2) for x in g.values()))
    scale = min(1.0, cfg.grad_clip / norm)
    lr = cfg.lr * min(1.0, (t + 1) / cfg.warmup_steps)
    for k in p:
      gk = g[k] * scale
      m[k] = cfg.b1 * m[k] + (1 - cfg.b1) * gk
      v[k] = cfg.b2 * v[k] + (1 - cfg.b2) * gk**2
      mhat = m[k] / (1 - cfg.b1 ** (t + 1))
      vhat = v[k] / (1 - cfg.b2 ** (t + 1))
      p[k] = p[k] - lr * (mhat / (np.sqrt(vhat) + cfg.eps) + cfg.weight_decay * p[k])
  return p


def test_adamw_clip_schedule_match_numpy_reference():
  cfg = optim.OptimConfig(
    lr=0.1,
    b1=0.8,
    b2=0.95,
    eps=1e-3,
    weight_decay=0.1,
    grad_clip=1.0,
    warmup_steps=3,
  )
  rng = np.random.default_rng(0)
  params = {
    "a": rng.normal(size=(3, 2)).astype(np.float32),
    "b": rng.normal(size=(4,)).astype(np.float32),
  }
  # Gradient norms far above and below the clip threshold, so clipping changes Adam's ratios.
  grads_seq = [
    {k: (s * rng.normal(size=x.shape)).astype(np.float32) for k, x in params.items()}
    for s in (30.0, 0.05, 5.0, 0.2)
  ]
  state = TrainState.create(jax.tree.map(jnp.asarray, params), optim.make_optimizer(cfg), 0)
  step = jax.jit(lambda s, g: s.apply_gradients(g))
  for g in grads_seq:
    state = step(state, jax.tree.map(jnp.asarray, g))
  want = _numpy_adamw(params, grads_seq, cfg)
  for k in params:
    np.testing.assert_allclose(np.asarray(state.params[k]), want[k], rtol=2e-5, atol=2e-6)
  assert int(state.step) == 4
  assert int(optim.optimizer_update_count(state.opt_state)) == 4


def test_reset_optimizer_zeroes_moments_and_restarts_warmup():
  cfg = optim.OptimConfig(lr=0.1, warmup_steps=3)
  tx = optim.make_optimizer(cfg)
  params = {"w": jnp.arange(6.0).reshape(2, 3)}
  state = TrainState.create(params, tx, 3)
  for _ in range(5):
    state = state.apply_gradients({"w": jnp.ones((2, 3)) * 0.5})
  assert float(optim.current_learning_rate(cfg, state.opt_state)) == pytest.approx(0.1)
  reset = reset_optimizer(state)
  adam = [
    x
    for x in jax.tree.leaves(reset.opt_state, is_leaf=lambda x: hasattr(x, "mu"))
    if hasattr(x, "mu")
  ][0]
  chex.assert_trees_all_equal(adam.mu, jax.tree.map(jnp.zeros_like, params))
  chex.assert_trees_all_equal(adam.nu, jax.tree.map(jnp.zeros_like, params))
  assert int(optim.optimizer_update_count(reset.opt_state)) == 0
  assert float(optim.current_learning_rate(cfg, reset.opt_state)) == pytest.approx(0.1 / 3)
  assert int(reset.step) == 5
  chex.assert_trees_all_equal(reset.params, state.params)
  chex.assert_trees_all_equal(reset.rng, state.rng)
  # The next update is the one a brand-new optimizer would make from these params.
  g = {"w": jnp.full((2, 3), 0.3)}
  fresh = TrainState.create(state.params, tx, 3).apply_gradients(g)
  chex.assert_trees_all_close(reset.apply_gradients(g).params, fresh.params, rtol=0, atol=0)


def test_reset_optimizer_keeps_shardings():
  from jax.sharding import AxisType, NamedSharding
  from jax.sharding import PartitionSpec as P

  mesh = jax.make_mesh((4, 2), ("fsdp", "tensor"), axis_types=(AxisType.Auto,) * 2)
  w = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("fsdp", "tensor")))
  state = TrainState.create({"w": w}, optim.make_optimizer(optim.OptimConfig()), 0)
  state = state.apply_gradients({"w": jnp.ones((8, 4))})
  reset = reset_optimizer(state)
  for old, new in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(reset.opt_state)):
    assert new.sharding == old.sharding
  assert reset.opt_state[1][0].mu["w"].sharding.spec == P("fsdp", "tensor")
