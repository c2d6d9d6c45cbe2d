"""Learner: train state, AdamW, pure SFT / GRPO-RoC steps (sharded, micro-batched), checkpoints."""

from rstar_jax.learner.batch import make_rl_batch, make_sft_batch
from rstar_jax.learner.checkpoint import Checkpointer, export_hf
from rstar_jax.learner.optim import OptimConfig, make_optimizer, make_schedule
from rstar_jax.learner.steps import (
  JittedSteps,
  StepConfig,
  compute_logprobs,
  logprob_drift,
  make_jitted_steps,
  rl_step,
  sft_step,
  with_old_logprobs,
)
from rstar_jax.learner.train_state import TrainState, reset_optimizer
