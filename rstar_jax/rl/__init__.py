"""GRPO-RoC as pure JAX transforms: RoC down-sampling, advantages, losses (jax only, no I/O)."""

from rstar_jax.rl import advantages, losses, off_policy, registry, roc, selection

__all__ = ["advantages", "losses", "off_policy", "registry", "roc", "selection"]
