"""Mesh construction and the logical-axis sharding rules."""

from rstar_jax.sharding.mesh import make_mesh, resolve_axis_sizes, use_mesh
from rstar_jax.sharding.rules import (
  LAYOUTS,
  SAMPLING_RULES,
  TRAIN_RULES,
  activation_layout,
  constrain,
  get_rules,
  logical_to_shardings,
  logical_to_spec,
)
