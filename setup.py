"""rstar_jax: agentic RL (rStar2-Agent GRPO-RoC + ASTER cold start) in pure-functional JAX."""
from setuptools import find_packages, setup

setup(
    name="rstar_jax",
    version="0.1.0",
    description="rStar2-Agent / ASTER agentic RL with a Python code tool, in JAX",
    packages=find_packages(include=["rstar_jax", "rstar_jax.*", "launchers", "configs"]),
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.10",
        "flax>=0.12",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12",
        "chex>=0.1.92",
        "transformers>=5.0",
        "safetensors>=0.8",
        "tokenizers>=0.23",
        "sympy>=1.14",
        "numpy>=2.0",
        "absl-py>=2.0",
        "ml-collections>=1.1",
        "math-verify==0.9.0",
        "aiohttp>=3.9",
        "tensorboardX>=2.6",
        "matplotlib>=3.8",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "torch==2.13.0",
            "reasoning-gym==0.1.25",
            "ray>=2.50",
            "ruff>=0.6",
        ],
        "ray": ["ray>=2.50"],
    },
)
