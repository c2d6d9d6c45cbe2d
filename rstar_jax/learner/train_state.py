"""Immutable training state: a pytree of arrays plus the optax transformation as static data."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

PyTree = Any


@flax.struct.dataclass
class TrainState:
  """Everything an update changes, as one pytree (jit/donate/checkpoint friendly).

  Attributes:
      step: int32 [] optimizer updates applied over the whole run (never reset; stage
          transitions reset the optimizer but not this counter).
      params: model parameters (nested dict of arrays).
      opt_state: optax state of ``tx``.
      rng: uint32 [2] raw PRNG key data for the loop's randomness (RoC sampling, data order).
          Kept raw (not a typed key) so orbax saves it as a plain array.
      tx: the optax transformation; static (not a pytree leaf), so two states built with
          different ``tx`` objects have different tree structures.
  """

  step: jax.Array
  params: PyTree
  opt_state: optax.OptState
  rng: jax.Array
  tx: optax.GradientTransformation = flax.struct.field(pytree_node=False)

  @classmethod
  def create(
    cls, params: PyTree, tx: optax.GradientTransformation, rng: jax.Array | int
  ) -> TrainState:
    """Fresh state at step 0. ``rng``: a seed, a raw uint32 [2] key or a typed key."""
    return cls(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=tx.init(params),
      rng=_raw_key(rng),
      tx=tx,
    )

  def apply_gradients(self, grads: PyTree) -> TrainState:
    """One optimizer update; ``grads`` has the structure of ``params``."""
    updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
    params = optax.apply_updates(self.params, updates)
    return self.replace(step=self.step + 1, params=params, opt_state=opt_state)

  def split_rng(self) -> tuple[TrainState, jax.Array]:
    """Returns (state with an advanced rng, a fresh raw key for the caller)."""
    new, sub = jax.random.split(self.rng)
    return self.replace(rng=new), sub


def _raw_key(rng) -> jax.Array:
  if isinstance(rng, (int, np.integer)):
    return jax.random.key_data(jax.random.key(int(rng)))
  rng = jnp.asarray(rng) if not isinstance(rng, jax.Array) else rng
  if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(rng)
  if rng.dtype != jnp.uint32 or rng.shape != (2,):
    raise ValueError(
      f"TrainState rng: expected a seed, a typed key or uint32 [2] key data, "
      f"got dtype {rng.dtype} shape {rng.shape}"
    )
  return rng


def reset_optimizer(state: TrainState) -> TrainState:
  """Stage transition: fresh optimizer state (zero moments, update count 0 so warm-up restarts).

  ``step``, ``params`` and ``rng`` are kept. The new optimizer state is placed on the same
  shardings as the old one so a jitted step compiled for the old state still applies.
  """
  fresh = state.tx.init(state.params)
  old_leaves = jax.tree.leaves(state.opt_state)
  if old_leaves and all(isinstance(x, jax.Array) for x in old_leaves):
    fresh = jax.device_put(fresh, jax.tree.map(lambda x: x.sharding, state.opt_state))
  return state.replace(opt_state=fresh)
