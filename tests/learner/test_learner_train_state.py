"""TrainState: pytree structure, rng handling, apply_gradients under jit."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rstar_jax.learner.train_state import TrainState


def test_leaves_and_static_tx():
  tx = optax.sgd(0.5)
  state = TrainState.create({"w": jnp.ones(3)}, tx, 0)
  leaves = jax.tree.leaves(state)
  # step, w, rng (sgd has no array state); tx is not a leaf.
  assert len(leaves) == 3 and not any(isinstance(x, optax.GradientTransformation) for x in leaves)
  new = jax.jit(lambda s, g: s.apply_gradients(g))(state, {"w": jnp.full(3, 2.0)})
  np.testing.assert_allclose(new.params["w"], [0.0] * 3)
  assert int(new.step) == 1 and new.tx is tx
  with pytest.raises(dataclasses.FrozenInstanceError):
    new.step = 5


def test_rng_forms_and_split():
  tx = optax.sgd(0.1)
  a = TrainState.create({}, tx, 3)
  b = TrainState.create({}, tx, jax.random.key(3))
  c = TrainState.create({}, tx, jax.random.key_data(jax.random.key(3)))
  chex.assert_trees_all_equal(a.rng, b.rng, c.rng)
  assert a.rng.dtype == jnp.uint32 and a.rng.shape == (2,)
  a2, k1 = a.split_rng()
  a3, k2 = a2.split_rng()
  assert not np.array_equal(k1, k2) and not np.array_equal(a.rng, a2.rng)
  b2, k1b = b.split_rng()
  chex.assert_trees_all_equal((a2.rng, k1), (b2.rng, k1b))  # deterministic
  with pytest.raises(ValueError, match="uint32 \\[2\\] key data"):
    TrainState.create({}, tx, jnp.zeros(3, jnp.float32))
