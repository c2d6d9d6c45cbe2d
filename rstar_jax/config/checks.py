"""The config layer's field checks: the shared vocabulary (`rstar_jax.config_fields`, which the
learner's `OptimConfig` is written in too) plus `registered`, which looks names up in the
`rstar_jax.rl` registry and so cannot sit in the bottom layer with the rest."""

from __future__ import annotations

# Re-exported: the one import the schema and the converter read their vocabulary from.
from rstar_jax.config_fields import (  # noqa: F401
  IS_BOOL,
  IS_STR,
  STR_TUPLE,
  Check,
  ConfigError,
  Section,
  did_you_mean,
  field,
  int_range,
  num_range,
  one_of,
  run_checks,
  section,
)


def registered(kind: str) -> Check:
  """A name registered in `rstar_jax.rl.registry` under ``kind`` (read when checked, so a
  function a user registers before converting the config is accepted)."""

  class _Names:
    def __str__(self):
      from rstar_jax.rl import registry  # rstar_jax.rl imports jax; config stays jax-free

      return f"one of {registry.names(kind)} (rstar_jax.rl.registry '{kind}')"

  def ok(v):
    from rstar_jax.rl import registry  # rstar_jax.rl imports jax; config stays jax-free

    return isinstance(v, str) and v in registry.names(kind)

  return Check(_Names(), ok)  # type: ignore[arg-type]
