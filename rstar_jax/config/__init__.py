"""Typed run configuration: `schema` (the dataclasses, defaults, checks, docs) and
`convert.from_config_dict` (ml_collections recipe -> `RunConfig`, once, at the launcher edge)."""

from rstar_jax.config.checks import ConfigError
from rstar_jax.config.convert import from_config_dict
from rstar_jax.config.schema import (
  ColdStartConfig,
  DataConfig,
  DemoConfig,
  EvalConfig,
  MeshConfig,
  ModelConfig,
  OptimConfig,
  PlanConfig,
  RLConfig,
  RolloutConfig,
  RunConfig,
  SftConfig,
  StageConfig,
  SyntheticDataConfig,
  ToolConfig,
  TrainConfig,
)

__all__ = [
  "ColdStartConfig",
  "ConfigError",
  "DataConfig",
  "DemoConfig",
  "EvalConfig",
  "MeshConfig",
  "ModelConfig",
  "OptimConfig",
  "PlanConfig",
  "RLConfig",
  "RolloutConfig",
  "RunConfig",
  "SftConfig",
  "StageConfig",
  "SyntheticDataConfig",
  "ToolConfig",
  "TrainConfig",
  "from_config_dict",
]
