"""rstar_jax: agentic RL (rStar2-Agent GRPO-RoC + ASTER cold start) in pure-functional JAX.

Only the `rstar_jax` package is installed. `launchers/` and `configs/` are run from a clone
(`python -m launchers.train --config=configs/...` in the repository root, which `python -m` puts
on sys.path); installing them would add top-level packages named `configs` and `launchers` that
collide with a user's own.
"""

import os
import re

from setuptools import find_packages, setup

_HERE = os.path.dirname(os.path.abspath(__file__))


def _version() -> str:
  # Read, not imported: importing the package at build time would need its dependencies.
  with open(os.path.join(_HERE, "rstar_jax", "__init__.py")) as f:
    return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


setup(
  name="rstar_jax",
  version=_version(),
  description="rStar2-Agent / ASTER agentic RL with a Python code tool, in JAX",
  license="Apache-2.0",
  license_files=["LICENSE"],
  packages=find_packages(include=["rstar_jax", "rstar_jax.*"]),
  package_data={"rstar_jax": ["py.typed"]},
  # jax / jaxlib 0.10, flax 0.12, orbax-checkpoint 0.12 and chex 0.1.92 all require >= 3.11.
  python_requires=">=3.11",
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
    # Loading an export in transformers (AutoModelForCausalLM needs torch; apply_chat_template
    # needs jinja2). torch 2.13.0 is the CPU wheel the project machines hold locally.
    "hf": ["torch==2.13.0", "jinja2>=3.1"],
    "test": [
      "pytest>=8",
      "pytest-timeout>=2.3",
      # scripts/test.sh runs the suite on 2 workers (--dist loadfile) when this is installed
      # (3.8: --no-loadscope-reorder, which keeps the slow-first module order of tests/conftest.py)
      "pytest-xdist>=3.8",
      "torch==2.13.0",
      "jinja2>=3.1",
      "reasoning-gym==0.1.25",
      "ray>=2.50",
      "ruff>=0.6",
      # the import layers in the style gate (pyproject.toml [tool.importlinter])
      "import-linter>=2.17",
      "peft==0.21.2",
      # the optional extras below, so their tests run in CI
      "pyarrow>=15",
      "datasets>=3",
      "wandb>=0.19.10",
      # the docs site's strict build (tests/test_docs.py)
      "mkdocs>=1.6",
      "mkdocs-material>=9.5",
      "mkdocstrings[python]>=1.0",
      "mkdocstrings-python>=2.0",
      # rollout.router_url: SGLang's router, started by tests/pipelines/test_sglang_router_rl.py
      "sglang-router==0.3.2",
    ],
    "ray": ["ray>=2.50"],
    # rollout.router_url (rstar_jax/rollout/README.md, "SGLang's router")
    "router": ["sglang-router==0.3.2"],
    # the docs site: mkdocs.yml over docs/, API pages from the docstrings (mkdocs build --strict)
    "docs": [
      "mkdocs>=1.6",
      "mkdocs-material>=9.5",
      "mkdocstrings[python]>=1.0",
      "mkdocstrings-python>=2.0",
    ],
    # data.format parquet / hf_dataset (rstar_jax.data.formats)
    "data": ["pyarrow>=15", "datasets>=3"],
    # log.wandb (rstar_jax.pipelines.metrics_log; 0.19.10: wandb.init(reinit="create_new"))
    "wandb": ["wandb>=0.19.10"],
  },
)
