"""Learner: train state, AdamW, pure SFT / GRPO-RoC steps (sharded, micro-batched), checkpoints.

The names below are imported on first use (PEP 562): the run config imports the jax-free
`rstar_jax.learner.optim_config`, and importing a submodule runs this file first, which must not
pull jax in with it (``--help`` and ``--describe_config`` stay fast).
"""

import importlib

_EXPORTS = {
  "make_rl_batch": "batch",
  "make_sft_batch": "batch",
  "Checkpointer": "checkpoint",
  "export_hf": "checkpoint",
  "OptimConfig": "optim_config",
  "make_optimizer": "optim",
  "make_schedule": "optim",
  "JittedSteps": "steps",
  "StepConfig": "steps",
  "compute_logprobs": "steps",
  "logprob_drift": "steps",
  "make_jitted_steps": "steps",
  "make_lora_jitted_steps": "steps",
  "rl_step": "steps",
  "sft_step": "steps",
  "with_old_logprobs": "steps",
  "TrainState": "train_state",
  "reset_optimizer": "train_state",
}
_SUBMODULES = frozenset(_EXPORTS.values()) | {"lora_training", "packing"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name in _SUBMODULES:  # ``rstar_jax.learner.steps`` after a bare ``import rstar_jax.learner``
    return importlib.import_module(f"{__name__}.{name}")
  if name not in _EXPORTS:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__():
  return sorted(set(globals()) | set(_EXPORTS) | _SUBMODULES)
