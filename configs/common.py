"""Shared config builders. Defaults, checks and one-line docs of every field live ONLY in the
typed dataclasses of `rstar_jax/config/schema.py`; these helpers turn them into the
``ml_collections.ConfigDict`` sections the recipe files override (so absl ``config_flags``
and ``--config.rl.group_size=8`` keep working). Launchers convert a whole recipe once with
`rstar_jax.config.from_config_dict`, which rejects unknown keys ("did you mean ...").

Sections: model, mesh, optim, rl, rollout, tool, train, eval, data, stages (a list of stage
dicts), reward, log, and optionally sft, sft_optim, coldstart, demo, plan. A new setting is one line in the
section's dataclass; nothing here changes. Where each recipe value comes from (paper,
released code) and the test that checks it: docs/fidelity.md.
"""

import ml_collections

from rstar_jax.config import schema
from rstar_jax.errors import UserError


def check_variant(variant: str, recipe: str, variants=schema.MODES) -> str:
  """``variant`` (the ``:name`` after a recipe path) if it is one of ``variants``; else a
  one-line `UserError` listing them (a typo such as ``:sfT`` must not run the default job)."""
  if variant not in variants:
    raise UserError(
      f"{recipe}: unknown variant {variant!r}; expected one of "
      + ", ".join(repr(v) for v in variants)
    )
  return variant


def section(cls, **overrides) -> ml_collections.ConfigDict:
  """A ConfigDict of ``cls``'s defaults with ``overrides`` applied (unknown names raise)."""
  d = schema.defaults_dict(cls)
  unknown = sorted(set(overrides) - set(d))
  if unknown:
    raise ValueError(f"{cls.__name__}: unknown fields {unknown}")
  d.update(overrides)
  return ml_collections.ConfigDict(d)


def model_config(hf_dir: str = "", **tiny) -> ml_collections.ConfigDict:
  """The policy: an HF dir (real runs) or tiny from-scratch dims given as keywords."""
  return section(schema.ModelConfig, hf_dir=hf_dir, **tiny)


def mesh_config(data: int = 1, fsdp: int = -1, tensor: int = 1) -> ml_collections.ConfigDict:
  return section(schema.MeshConfig, data=data, fsdp=fsdp, tensor=tensor)


def optim_config(**overrides) -> ml_collections.ConfigDict:
  """AdamW + schedule, e.g. ``optim_config(lr=1e-6, warmup_steps=20, schedule="constant")``."""
  return section(schema.OptimConfig, **overrides)


def rl_config(**overrides) -> ml_collections.ConfigDict:
  return section(schema.RLConfig, **overrides)


def rollout_config(engine: str = "jax", **overrides) -> ml_collections.ConfigDict:
  return section(schema.RolloutConfig, engine=engine, **overrides)


def tool_config(**overrides) -> ml_collections.ConfigDict:
  return section(schema.ToolConfig, **overrides)


def train_config(**overrides) -> ml_collections.ConfigDict:
  return section(schema.TrainConfig, **overrides)


def eval_config(**overrides) -> ml_collections.ConfigDict:
  return section(schema.EvalConfig, **overrides)


def sft_config(**overrides) -> ml_collections.ConfigDict:
  return section(schema.SftConfig, **overrides)


def coldstart_config(**overrides) -> ml_collections.ConfigDict:
  return section(schema.ColdStartConfig, **overrides)


def plan_config(**overrides) -> ml_collections.ConfigDict:
  return section(schema.PlanConfig, **overrides)


def synthetic_data(**overrides) -> ml_collections.ConfigDict:
  """``data`` with synthetic tasks (used when the paths are empty)."""
  data = section(schema.DataConfig)
  data.synthetic = section(schema.SyntheticDataConfig, **overrides)
  return data


def one_digit_mul() -> dict:
  """`SyntheticDataConfig` fields of one-digit products (a fresh dict per call): a ~70k-parameter
  model copies the operands into its code after a few dozen SFT steps (the tiny recipes' and
  the :debug overlays' tasks)."""
  return dict(
    seed=0,
    families=["mul"],
    difficulty=dict(
      operand_digits=1,
      modulus_digits=2,
      exponent_digits=2,
      range_max=1_000,
      n_max=40,
      index_max=500,
    ),
  )


def data_config(**overrides) -> ml_collections.ConfigDict:
  return section(schema.DataConfig, **overrides)


def stage(name: str, steps: int, response_budget: int, max_turns: int, **overrides) -> dict:
  """One RL stage (`schema.StageConfig`). ``data="hard"`` trains on the subset left after
  dropping problems the policy at the stage start solves k of k times
  (``drop_solved_k_of_k`` = k; rStar2-Agent stage 3: k = 8); ``data="recent"`` drops instead
  the problems whose training rollouts were all correct at their latest appearance in the last
  ``recent_steps`` RL steps (ASTER stage 2; no re-sampling)."""
  d = schema.defaults_dict(schema.StageConfig)
  d.update(
    name=name, steps=steps, response_budget=response_budget, max_turns=max_turns, **overrides
  )
  return d


def reward_config(**overrides) -> ml_collections.ConfigDict:
  """``reward``: registry names (`rstar_jax.rewards.registry`) and the user modules to import
  (``imports`` a comma-separated string here, so ``--config.reward.imports=a,b`` parses)."""
  return section(schema.RewardConfig, **{"imports": "", **overrides})


def log_config(**overrides) -> ml_collections.ConfigDict:
  """``log``: W&B and sample-rollout logging besides metrics.jsonl + TensorBoard."""
  return section(schema.LogConfig, **overrides)


# A real recipe's ``:debug`` variants: the recipe with the settings a one-CPU machine needs,
# so ``--config=configs/rstar2_qwen3_14b.py:debug --config.model.hf_dir=DIR`` runs one step of
# the recipe's own chat format, tool loop, reward and losses against a small local checkpoint.
DEBUG_VARIANTS = {"debug": "rl", "sft_debug": "sft", "eval_debug": "eval"}


def recipe_variant(variant: str, recipe: str) -> tuple[str, bool]:
  """(mode, debug) of a real recipe's ``:variant``: a mode ('rl', 'sft', 'eval') or one of
  `DEBUG_VARIANTS`; anything else is a one-line `UserError` listing them."""
  check_variant(variant, recipe, (*schema.MODES, *DEBUG_VARIANTS))
  return DEBUG_VARIANTS.get(variant, variant), variant in DEBUG_VARIANTS


def debug_overlay(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``c`` (a real recipe) changed to run one step on one CPU: one device and no sharding,
  float32 without remat, the embedded JaxSampler instead of SGLang servers, 2 prompts x 2
  kept rollouts of 64 tokens and 2 turns, 1 micro-batch, synthetic one-digit problems instead
  of the recipe's data paths, and a 2-problem eval at k = 1 without the recipe's eval protocol.
  Everything else (chat format, tool settings, reward, losses, optimizer, stage structure) stays
  the recipe's. The model is ``--config.model.hf_dir`` (a transformers-built directory with a
  tokenizer); the recipe's path is kept otherwise, so a missing model is one line."""
  c.mesh = mesh_config(data=1, fsdp=-1, tensor=1)
  c.mesh.num_devices = 1
  c.model.dtype, c.model.param_dtype, c.model.remat = "float32", "float32", False
  c.model.attention = "xla"
  c.rollout.engine = "jax"
  c.rollout.max_batch, c.rollout.max_len = 8, 0
  c.rollout.max_prompt_tokens = 2048  # byte-level prompts of a small tokenizer are long
  c.rollout.response_budget, c.rollout.max_turns = 64, 2
  c.tool.num_workers = 2
  c.train.batch_prompts = 2
  c.train.micro_batches = 1
  c.train.checkpoint_every = 1
  c.train.eval_every = 0
  c.rl.group_size, c.rl.min_pos, c.rl.min_neg = 2, 1, 1
  c.rl.ppo_mini_batches = min(c.rl.ppo_mini_batches, 2)
  c.data.train_path = c.data.sft_path = ""
  c.data.synthetic = section(schema.SyntheticDataConfig, **one_digit_mul(), n_train=4, n_eval=2)
  if "coldstart" in c:
    c.coldstart.min_tool_calls, c.coldstart.max_trajectories = 0, 0
    c.coldstart.require_all_calls_ok = False
  c.eval.path, c.eval.protocol = "", ""
  c.eval.k, c.eval.max_problems, c.eval.response_budget, c.eval.max_turns = 1, 2, 64, 2
  if c.get("sft") is not None:
    # 2048: the chat template, tool block and system prompt of a recipe rendered with a small
    # byte-level tokenizer take ~1,000-1,500 tokens (512 dropped every item).
    c.sft.epochs, c.sft.batch_size, c.sft.max_seq_len = 1.0, 2, 2048
    c.sft.warmup_ratio = 0.0
  if c.stages:
    first = dict(c.stages[0])
    first.update(steps=1, response_budget=64, max_turns=2, data="full")
    c.stages = [first]
  return c
