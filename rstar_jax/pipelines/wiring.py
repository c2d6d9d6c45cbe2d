"""Builds the run's parts from a typed `RunConfig`: the code pool, the training set, the learner
and tokenizer of an RL run, and the group source.

The one place a config section becomes an object: the loops take the objects and never read the
config to decide how a part is built.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import jax

from rstar_jax.config import RunConfig, ToolConfig
from rstar_jax.data import filters as data_filters
from rstar_jax.data.problems import Problem
from rstar_jax.errors import UserError
from rstar_jax.pipelines import data_sources, runtime
from rstar_jax.rollout.async_source import AsyncSource
from rstar_jax.rollout.sources import GroupSource, SyncSource
from rstar_jax.tools.client import CodePoolClient
from rstar_jax.tools.code_pool import CodePool, PoolConfig
from rstar_jax.tools.service_token import client_token

log = logging.getLogger(__name__)

TOOL_BACKENDS = ("local", "http", "ray")


def tool_pool(tool: ToolConfig):
  """The (not yet started) code pool named by ``tool.backend``, for this JAX process:

  * "local": a `CodePool` in this process (one per JAX process; default);
  * "http":  a `CodePoolClient` of the service (`launchers.code_pool_server`) at
    ``tool.urls[i % len(tool.urls)]`` for process i;
  * "ray":   a `RayCodePool` (one pool actor per Ray node), connecting with
    ``ray.init(address=tool.ray_address)`` when Ray is not initialised yet.
  """
  backend = tool.backend
  limits = dict(
    num_workers=int(tool.num_workers),
    timeout_s=float(tool.timeout_s),
    memory_limit_mb=int(tool.memory_limit_mb),
  )
  if backend == "local":
    return CodePool(**limits)
  if backend == "http":
    urls = list(tool.urls)
    if not urls:
      raise ValueError(
        "tool.urls: expected at least one code-pool service URL for tool.backend='http', got ()"
      )
    # The service's shared secret comes from this process's $RSTAR_CODE_POOL_TOKEN_FILE or
    # $RSTAR_CODE_POOL_TOKEN (rstar_jax/tools/README.md); a bad token file fails here, at build.
    return CodePoolClient(urls[jax.process_index() % len(urls)], token=client_token())
  if backend == "ray":
    # Ray is an optional extra (setup.py "ray"): imported only when this backend is chosen.
    import ray

    from rstar_jax.tools.ray_pool import RayCodePool

    if not ray.is_initialized():
      ray.init(address=tool.ray_address or "auto")
    return RayCodePool(PoolConfig(**limits))
  raise ValueError(f"tool.backend: expected one of {TOOL_BACKENDS}, got {backend!r}")


def group_source(run: RunConfig, runner, *, on_start=None) -> GroupSource:
  """The RL loop's group source: `SyncSource` at ``rl.max_staleness = 0``, else `AsyncSource`
  (``on_start``: the synchronous source's progress ticker factory)."""
  rl = run.rl
  n = rl.oversample * rl.group_size
  if rl.max_staleness == 0:
    return SyncSource(runner, num_samples=n, max_retries=rl.max_step_retries, on_start=on_start)
  return AsyncSource(
    runner,
    max_staleness=rl.max_staleness,
    partial_rollout=rl.partial_rollout,
    num_samples=n,
    batch_prompts=run.train.batch_prompts,
    base_seed=run.train.seed,
    max_retries=rl.max_step_retries,
  )


class EmptyTrainingSet(UserError, ValueError):
  """No training problem is left after the filters: the launcher prints one line."""


def training_set(
  run: RunConfig, problems: Sequence[Problem], runner
) -> tuple[list[Problem], dict[str, int]]:
  """The RL training problems after the ``data`` filters (integer answers, prompt length),
  with the filter counts (logged every step). Raises when nothing is left."""
  # A runner without prompt rendering (a test double) has no prompt to measure or refuse.
  prompt_length = getattr(runner, "prompt_length", None)
  kept, counts = data_filters.filter_problems(
    list(problems),
    integer_answers_only=run.data.integer_answers_only,
    max_prompt_tokens=run.rollout.max_prompt_tokens
    if run.data.drop_overlong_prompts and prompt_length
    else 0,
    prompt_length=prompt_length,
  )
  if counts["filter_kept"] < counts["filter_total"]:
    log.info("training set filters: %s", counts)
  if not kept:
    raise EmptyTrainingSet(
      f"RL loop: the training problem set is empty (filters: {counts}); check "
      "data.train_path, or raise rollout.max_prompt_tokens when filter_dropped_overlong "
      "counts them all"
    )
  return kept, counts


def rl_setup(
  run: RunConfig,
  workdir: str,
  *,
  problems: Sequence[Problem] | None = None,
  eval_problems: Sequence[Problem] | None = None,
  tokenizer: Any = None,
  params: Any = None,
) -> tuple[Sequence[Problem], Sequence[Problem] | None, Any, runtime.Learner]:
  """(problems, eval_problems, tokenizer, learner) of an RL run: each from the config unless
  given (``eval_problems`` only when ``train.eval_every``; a from-scratch model's tokenizer
  is trained into ``workdir``)."""
  os.makedirs(workdir, exist_ok=True)
  if problems is None:
    problems = data_sources.train_problems(run)
  if eval_problems is None and run.train.eval_every:
    eval_problems = data_sources.eval_problems(run)
  if tokenizer is None:
    tokenizer = data_sources.ensure_tokenizer(run, workdir, data_sources.tokenizer_corpus(problems))
  learner = runtime.build_learner(run, params=params)
  runtime.check_vocab(tokenizer, learner.model_config)
  return problems, eval_problems, tokenizer, learner
