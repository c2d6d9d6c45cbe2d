"""Named evaluation protocols: the eval settings a protocol name stands for.

  released        the released rStar2-Agent AIME / MATH-500 scripts (microsoft/rStar
                  examples/aime_eval.sh): val_kwargs.n = 16, verl's validation sampling left at
                  its default (do_sample False, temperature 0: greedy), 5 assistant turns
                  (max_assistant_turns), 30,720 response tokens (data.max_response_length).
  paper_avg_at_k  the rStar2-Agent paper's avg@k: k = 16 samples at temperature 0.6, top-p 0.95,
                  up to 30 turns and 30,720 tokens; pass@1 averaged over the k samples.
Both report avg@k (mean correctness over all k samples of all problems) and pass@k (share of
problems solved at least once; `rstar_jax.pipelines.evaluation.write_csv` writes one row per
problem). Selected with ``eval.protocol`` (`rstar_jax.config.EvalConfig`); `resolve` applies it.
In the config layer (jax-free): the launchers resolve it before any work, and planning sizes
the sampler's KV cache from the resolved response budget.

A protocol fills only the fields left at their schema default: a value the recipe or the command
line set (``--config.eval.k=2``) wins and is logged as kept, unless ``eval.protocol_strict`` is
set, where it is a one-line `ConfigError` naming the field. Each replaced field is logged once
(``eval.temperature: 0.6 -> 0.0``, old -> new), so a run never silently evaluates with other settings than
the ones it was given.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from rstar_jax.config.checks import ConfigError
from rstar_jax.config.schema import EvalConfig

log = logging.getLogger(__name__)

PROTOCOLS: dict[str, dict[str, Any]] = {
  "released": dict(k=16, temperature=0.0, top_p=1.0, max_turns=5, response_budget=30720),
  "paper_avg_at_k": dict(k=16, temperature=0.6, top_p=0.95, max_turns=30, response_budget=30720),
}


def resolve(eval_cfg: EvalConfig) -> EvalConfig:
  """The effective eval settings: ``eval_cfg`` with its protocol's k / sampling / turns /
  budget in the fields left at their defaults (module docstring), else ``eval_cfg`` itself.
  Logs each replaced / kept field once per process."""
  effective, notes = resolve_with_notes(eval_cfg)
  for line in notes:
    if line not in _LOGGED:
      _LOGGED.add(line)
      log.info("%s", line)
  return effective


_LOGGED: set[str] = set()


def resolve_with_notes(eval_cfg: EvalConfig) -> tuple[EvalConfig, list[str]]:
  """(effective settings, one line per field the protocol replaced or left to the user).

  Raises:
    ConfigError: ``eval.protocol_strict`` and a protocol field set to a non-default value.
  """
  name = eval_cfg.protocol
  if not name:
    return eval_cfg, []
  if name not in PROTOCOLS:
    raise ConfigError([("eval.protocol", f"expected one of {['', *PROTOCOLS]}, got {name!r}")])
  defaults = EvalConfig()
  replace, notes = {}, []
  for key, want in PROTOCOLS[name].items():
    have = getattr(eval_cfg, key)
    if have == want:
      continue
    if have != getattr(defaults, key):  # set by the recipe or the command line
      if eval_cfg.protocol_strict:
        raise ConfigError(
          [
            (
              f"eval.{key}",
              f"expected {want!r} (eval.protocol={name!r} with eval.protocol_strict), got {have!r}",
            )
          ]
        )
      notes.append(f"eval.{key}: keeping the given {have!r} (eval.protocol={name!r} sets {want!r})")
      continue
    replace[key] = want
    notes.append(f"eval.{key}: {have!r} -> {want!r} (eval.protocol={name!r})")
  return (dataclasses.replace(eval_cfg, **replace) if replace else eval_cfg), notes
