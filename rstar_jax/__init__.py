"""rstar_jax: rStar2-Agent GRPO-RoC and ASTER cold start in pure-functional JAX."""

__version__ = "0.1.0"  # the one place the version lives; setup.py reads it from here
