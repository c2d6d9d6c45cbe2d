"""ml_collections recipe -> typed `RunConfig`, once, at the launcher edge.

`from_config_dict` is the only place a ConfigDict is read. Missing keys take the dataclass
defaults (`rstar_jax.config.schema`); unknown keys are errors with a "did you mean"; every
problem of every section is collected and raised together as one `ConfigError`, so one run of
a launcher shows every typo at once.

``imports`` (a list of module names, or one comma-separated string) names the user's modules
that register losses, advantages or rewards in `rstar_jax.rl.registry`; they are imported
before any field is checked, so ``--config.imports=my_pkg.my_losses
--config.rl.policy_loss=positive_only`` works from any launcher without editing a recipe.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from rstar_jax.config import schema
from rstar_jax.config.checks import ConfigError, did_you_mean
from rstar_jax.user_modules import ImportsError, import_user_modules

Problems = list[tuple[str, str]]


def _plain(x: Any) -> Any:
  """ConfigDict / FieldReference / nested containers -> plain dicts, lists and values."""
  if hasattr(x, "to_dict"):
    x = x.to_dict()
  if hasattr(x, "get") and not isinstance(x, Mapping) and hasattr(x, "get_type"):
    x = x.get()  # an unresolved FieldReference
  if isinstance(x, Mapping):
    return {k: _plain(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_plain(v) for v in x]
  return x


def _build(cls: type, values: Any, path: str, problems: Problems, nested=None):
  """``cls(**values)`` with unknown keys reported; returns None (and records why) on error."""
  if values is None:
    return None
  if not isinstance(values, Mapping):
    problems.append((path, f"expected a config section, got {values!r}"))
    return None
  known = {f.name for f in dataclasses.fields(cls)}
  kw, bad = {}, False
  for k, v in values.items():
    if k not in known:
      problems.append((f"{path}.{k}", "unknown field" + did_you_mean(k, known)))
      bad = True
    elif nested and k in nested:
      v = nested[k](v, f"{path}.{k}", problems)
      bad |= v is _FAILED
      kw[k] = v
    else:
      kw[k] = tuple(v) if isinstance(v, list) else v
  try:  # checked even when some keys were bad, so every problem is reported at once
    obj = cls(**{k: v for k, v in kw.items() if v is not _FAILED})
  except ConfigError as e:
    prefix = cls.SECTION + "."
    problems += [
      (path + p[len(cls.SECTION) :] if p.startswith(prefix) or p == cls.SECTION else p, m)
      for p, m in e.problems
    ]
    return None
  return None if bad else obj


_FAILED = object()


def _difficulty(v, path, problems):
  if isinstance(v, str) or v is None:
    return v
  from rstar_jax.data import synthetic_tasks  # sympy: heavy, only for data.synthetic

  known = {f.name for f in dataclasses.fields(synthetic_tasks.Difficulty)}
  unknown = [k for k in v if k not in known]
  for k in unknown:
    problems.append((f"{path}.{k}", "unknown field" + did_you_mean(k, known)))
  if unknown:
    return _FAILED
  try:
    return synthetic_tasks.Difficulty(**v)
  except ValueError as e:
    problems.append((path, str(e)))
    return _FAILED


def _synthetic(v, path, problems):
  if v is None:
    return None
  out = _build(schema.SyntheticDataConfig, v, path, problems, {"difficulty": _difficulty})
  return _FAILED if out is None else out


def from_config_dict(
  cfg: Any, mode: str | None = None, *, check_inputs: bool = True, check_paths: bool = False
) -> schema.RunConfig:
  """The typed `RunConfig` of an ml_collections run config.

  Args:
    cfg: a ``ConfigDict`` (or mapping) with a ``mode`` and any of the `schema.SECTIONS` plus
      ``stages`` (a list of stage dicts). A `RunConfig` is returned as is (mode replaced).
    mode: "rl" | "sft" | "eval" (default ``cfg.mode``).
    check_inputs: require what the mode reads (stages, a problem / chat source); planning
      passes False.
    check_paths: the data files the mode reads must exist.
  Raises:
    ConfigError listing every problem (``config.<path>: expected ..., got ...``).
  """
  if isinstance(cfg, schema.RunConfig):
    run = cfg if mode in (None, cfg.mode) else dataclasses.replace(cfg, mode=mode)
  else:
    run = _convert(_plain(cfg), mode)
  if check_inputs:
    run.require_inputs()
  if check_paths:
    _check_paths(run)
  return run


def module_names(value: Any) -> tuple[str, ...]:
  """``"a, b.c"`` or ``["a", "b.c"]`` -> ``("a", "b.c")`` (blanks and repeats dropped)."""
  if value is None:
    return ()
  parts = value.split(",") if isinstance(value, str) else value
  if not isinstance(parts, (list, tuple)) or not all(isinstance(p, str) for p in parts):
    raise ConfigError([("imports", f"expected module names (a list of strings), got {value!r}")])
  out: list[str] = []
  for p in (p.strip() for p in parts):
    if p and p not in out:
      out.append(p)
  return tuple(out)


def import_modules(names: Any) -> tuple[str, ...]:
  """Imports each module of ``names`` through the one import path of user modules
  (`rstar_jax.user_modules.import_user_modules`, also what ``reward.imports`` uses); returns the names.
  A module that fails is one `ConfigError` line."""
  names = module_names(names)
  try:
    import_user_modules(names)
  except ImportsError as e:
    raise ConfigError([("imports", str(e).split(": ", 1)[1])]) from None
  return names


def _convert(d: Mapping[str, Any], mode: str | None) -> schema.RunConfig:
  problems: Problems = []
  mode = mode if mode is not None else d.get("mode")
  if mode not in schema.MODES:
    raise ConfigError([("mode", f"expected one of {list(schema.MODES)}, got {mode!r}")])
  known = set(schema.SECTIONS) | {"mode", "stages", "imports"}
  # First: what the imported modules register is checked by the sections below.
  kw: dict[str, Any] = {"mode": mode, "imports": import_modules(d.get("imports"))}
  for name, values in d.items():
    if name in ("mode", "imports"):
      continue
    if name not in known:
      problems.append((name, "unknown section" + did_you_mean(name, known)))
    elif name == "stages":
      kw["stages"] = _stages(values, problems)
    else:
      nested = {"synthetic": _synthetic} if name == "data" else None
      section = _build(schema.SECTIONS[name], values, name, problems, nested)
      if section is not None:
        kw[name] = section
  if problems:
    raise ConfigError(problems)
  return schema.RunConfig(**kw)


def _stages(values, problems: Problems):
  if values is None:
    return ()
  if not isinstance(values, (list, tuple)):
    problems.append(("stages", f"expected a list of stage dicts, got {values!r}"))
    return ()
  out = []
  for i, st in enumerate(values):
    path = f"stages[{i}]"
    if not isinstance(st, Mapping):
      problems.append((path, f"expected a stage dict, got {st!r}"))
      continue
    s = _build(schema.StageConfig, st, path, problems)
    if s is not None:
      out.append(s)
  return tuple(out)


def _check_paths(run: schema.RunConfig) -> None:
  out = []
  d = run.data
  # a local HF `datasets` directory is a data source too (data.format)
  if run.mode == "rl" and d.train_path and not os.path.exists(d.train_path):
    out.append(("data.train_path", f"expected an existing file, got {d.train_path!r} (not found)"))
  if run.mode == "sft" and d.sft_path and not os.path.exists(d.sft_path):
    out.append(("data.sft_path", f"expected an existing file, got {d.sft_path!r} (not found)"))
  if run.mode == "eval" and not (run.eval.path == "" and d.synthetic is not None):
    if not os.path.isfile(run.eval.path):
      out.append(("eval.path", f"expected an existing JSONL problem file, got {run.eval.path!r}"))
  if out:
    raise ConfigError(out)
