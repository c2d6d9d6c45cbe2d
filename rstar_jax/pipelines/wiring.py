"""Builds the run's parts from a typed `RunConfig`: the rollout settings, the engine, the code
pool, the agent runner, the group source, the training set, and the learner and tokenizer of an
RL run.

The one place a config section becomes an object: the loops take the objects and never read the
config to decide how a part is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

import jax

from rstar_jax.config import RunConfig, StageConfig, ToolConfig
from rstar_jax.data import filters as data_filters
from rstar_jax.data.problems import Problem
from rstar_jax.distributed import fleet
from rstar_jax.errors import UserError
from rstar_jax.pipelines import data_sources, eval_protocols, runtime
from rstar_jax.rewards import registry as reward_registry
from rstar_jax.rollout.agent_loop import RolloutSettings
from rstar_jax.rollout.agent_runner import AgentRunner
from rstar_jax.rollout.async_source import AsyncSource
from rstar_jax.rollout.jax_sampler import JaxSampler
from rstar_jax.rollout.sglang_engine import SGLangEngine
from rstar_jax.rollout.sources import GroupSource, SyncSource
from rstar_jax.tokenization import chat_format
from rstar_jax.tools import noise as tool_noise
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


# ---------------------------------------------------------------- rollout settings, engine, runner


def rollout_settings(
  run: RunConfig, stage: StageConfig | None = None, *, tokenizer: Any = None
) -> RolloutSettings:
  """The one `RolloutSettings` of an RL stage (``None``: the rollout section's own budget and
  turns): sampling and limits from ``rollout``, tool handling from ``tool``, and with a
  ``tokenizer`` the stop ids (<|im_end|> + the checkpoint's generation_config EOS ids)."""
  r, t = run.rollout, run.tool
  return RolloutSettings(
    response_budget=stage.response_budget if stage else r.response_budget,
    max_turns=stage.max_turns if stage else r.max_turns,
    temperature=r.temperature,
    top_p=r.top_p,
    top_k=r.top_k,
    max_parallel_calls=r.max_parallel_calls,
    max_tool_calls=r.max_tool_calls,
    tool_timeout_s=t.timeout_s,
    max_tool_response_chars=t.max_response_chars,
    tool_truncation=t.truncation,
    chat_format=r.chat_format,
    stateful_tool=t.stateful,
    stop_token_ids=chat_format.stop_token_ids(tokenizer, run.model.hf_dir)
    if tokenizer is not None
    else (),
  )


def eval_settings(run: RunConfig, *, tokenizer: Any = None) -> RolloutSettings:
  """Evaluation settings: the ``eval`` section (its named protocol applied, `eval_protocols`)
  for budget, turns and sampling; everything else as `rollout_settings`."""
  e = eval_protocols.resolve(run.eval)
  return dataclasses.replace(
    rollout_settings(run, tokenizer=tokenizer),
    response_budget=e.response_budget,
    max_turns=e.max_turns,
    temperature=e.temperature,
    top_p=e.top_p,
  )


def build_engine(run: RunConfig, model_config, params, tokenizer, *, weight_version: int = 0):
  """The rollout engine named by ``run.rollout.engine`` (SGLang: this process's servers and
  staging directory, `distributed.fleet`)."""
  r = run.rollout
  if r.engine == "jax":
    return JaxSampler(
      model_config,
      params,
      max_batch=r.max_batch,
      max_len=r.max_len or None,
      decode_chunk=r.decode_chunk,
      seed=run.train.seed,
      tokenizer=tokenizer,
      weight_version=weight_version,
    )
  return SGLangEngine(
    fleet.process_urls(list(r.sglang_urls)),
    staging_dir=fleet.process_staging_dir(r.staging_dir),
    weight_transport=r.weight_transport,
    weight_delta=r.weight_delta,
    colocated=r.colocated,
    server_timeout_s=r.server_timeout_s,
  )


def make_runner(
  run: RunConfig, engine, pool, tokenizer, *, runner_cls: type[AgentRunner] = AgentRunner
) -> AgentRunner:
  """The runner a run config describes (prompt layout, reward)."""
  r = run.rollout
  return runner_cls(
    engine,
    pool,
    tokenizer,
    chat_format=r.chat_format,
    system_prompt=r.system_prompt,
    with_tools=r.with_tools,
    show_tool_time=run.tool.show_time,
    max_prompt_tokens=r.max_prompt_tokens,
    answer_mode=run.rl.answer_mode,
    verify_timeout_s=run.reward.timeout_s,
    reward_fn=reward_registry.from_config(run),  # reward registry hook (issue 32)
  )


@contextlib.asynccontextmanager
async def open_runner(
  run: RunConfig,
  model_config,
  params,
  tokenizer,
  *,
  engine=None,
  runner_cls: type[AgentRunner] = AgentRunner,
) -> AsyncIterator[AgentRunner]:
  """Starts the code pool and the engine (``engine``: one already built); yields the runner
  (`make_runner`); closes both on exit. A remote engine is waited for until it answers."""
  if engine is None:
    engine = build_engine(run, model_config, params, tokenizer)
  pool = tool_noise.wrap(tool_pool(run.tool), run.tool)  # backend; injected failures
  await pool.start()
  try:
    if hasattr(engine, "wait_healthy"):  # remote servers: wait until they answer
      await engine.wait_healthy()
    yield make_runner(run, engine, pool, tokenizer, runner_cls=runner_cls)
  finally:
    await pool.close()
    close = getattr(engine, "close", None)
    if close is not None:
      res = close()
      if asyncio.iscoroutine(res):
        await res


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
