"""rstar_jax: rStar2-Agent GRPO-RoC and ASTER cold start in pure-functional JAX."""
