"""Builds the run's parts from a typed `RunConfig`: the learner (model, mesh, optimizer, jitted
steps, state), the rollout settings, the engine, the code pool, the agent runner, the group
source, the training set, and the pieces of an RL run (`rl_setup`).

Where the policy comes from (``config.model``):
  * ``hf_dir`` non-empty: an HF directory (config.json + safetensors [+ tokenizer.json]);
  * otherwise a tiny Qwen3 built from the ``model`` dims and randomly initialised from
    ``train.seed`` (CPU demo, tests).

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
import jax.numpy as jnp

from rstar_jax.config import RunConfig, StageConfig, ToolConfig, eval_protocols
from rstar_jax.data import filters as data_filters
from rstar_jax.data.problems import Problem
from rstar_jax.distributed import fleet
from rstar_jax.errors import UserError
from rstar_jax.learner import lora_training, optim, steps
from rstar_jax.learner.train_state import TrainState
from rstar_jax.models import lora, qwen3
from rstar_jax.pipelines import data_sources
from rstar_jax.planning import fit, plan
from rstar_jax.rewards import registry as reward_registry
from rstar_jax.rollout.agent_loop import RolloutSettings
from rstar_jax.rollout.agent_runner import AgentRunner
from rstar_jax.rollout.async_source import AsyncSource
from rstar_jax.rollout.jax_sampler import JaxSampler
from rstar_jax.rollout.sglang_engine import SGLangEngine
from rstar_jax.rollout.sources import GroupSource, SyncSource
from rstar_jax.sharding.mesh import make_mesh
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
  * "http":  a `CodePoolClient` over every service (`launchers.code_pool_server`) of
    ``tool.urls``, process i starting at ``tool.urls[i % len(tool.urls)]`` (a failed node's
    stateless calls go to the others; its sessions come back `session_lost`);
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
    first = jax.process_index() % len(urls)
    return CodePoolClient(urls[first:] + urls[:first], token=client_token())
  if backend == "ray":
    # Ray is an optional extra (setup.py "ray"): imported only when this backend is chosen.
    import ray

    from rstar_jax.tools.ray_pool import RayCodePool

    if not ray.is_initialized():
      ray.init(address=tool.ray_address or "auto")
    return RayCodePool(PoolConfig(**limits))
  raise ValueError(f"tool.backend: expected one of {TOOL_BACKENDS}, got {backend!r}")


# ---------------------------------------------------------------------------------- learner


def mesh_from(run: RunConfig) -> jax.sharding.Mesh:
  """The learner mesh; ``mesh.num_devices`` (0 = all) uses only the first n devices."""
  n = run.mesh.num_devices
  return make_mesh(run.mesh.axes, jax.devices()[:n] if n else None)


def data_parallel_size(js: steps.JittedSteps) -> int:
  out = 1
  for a in js.data_axes:
    out *= js.mesh.shape[a]
  return out


@dataclasses.dataclass
class Learner:
  """The trainable side of a run: model config, optimizer, jitted steps and the live state."""

  model_config: qwen3.Qwen3Config
  optim_config: optim.OptimConfig
  tx: Any
  jitted: steps.JittedSteps
  state: TrainState
  push_adapters: bool = False  # LoRA with rollout.lora_push=adapters

  @property
  def row_multiple(self) -> int:
    return data_parallel_size(self.jitted) * self.jitted.num_micro_batches

  def params_copy(self):
    """A copy of the params that survives the next (donating) step, e.g. for the sampler;
    with LoRA the merged weights (samplers and pushes get plain Qwen3 params), or with
    ``rollout.lora_push=adapters`` the `lora.LoraParams` themselves (the SGLang engine then
    pushes the adapters; the JaxSampler merges them)."""
    if self.push_adapters:
      return jax.tree.map(jnp.copy, self.state.params)
    return lora.merged_copy(self.state.params)


def initial_params(run: RunConfig, model_config: qwen3.Qwen3Config, mesh=None):
  dtype = jnp.dtype(run.model.param_dtype)
  if run.model.hf_dir:
    return qwen3.load_hf_params(run.model.hf_dir, model_config, mesh=mesh, dtype=dtype)
  return qwen3.init_params(model_config, jax.random.key(run.train.seed), dtype=dtype)


def build_learner(
  run: RunConfig,
  *,
  total_steps: int | None = None,
  params=None,
  base_ref: str = "",
  check_memory: bool = True,
) -> Learner:
  """Model config, optimizer, jitted steps on the config's mesh, and a fresh sharded state.

  With ``model.lora_rank > 0`` the params become `lora.LoraParams` (``params`` or the config's
  model as the frozen base, fresh adapters) and only the adapters train; ``base_ref`` names
  that base in checkpoints and PEFT exports (default ``model.hf_dir``, else the init seed).
  ``check_memory``: first check that the step on the run's largest batch fits the device
  (`planning.fit`; a one-line error before params or optimizer state are allocated).
  """
  model_config = run.model.qwen3_config()
  oc = run.optim.learner_config(total_steps)
  tx = optim.make_optimizer(oc)
  mesh = mesh_from(run)
  base_ref = base_ref or (
    os.path.abspath(run.model.hf_dir)
    if run.model.hf_dir
    else f"init_params(train.seed={run.train.seed})"
  )
  lora_cfg = run.model.lora_config(base_ref, run.train.seed)
  # Steps and optimizer come from shapes alone, so the memory check below runs before any
  # allocation and compiles the very jit objects the loop then calls.
  if lora_cfg is None:
    js = steps.make_jitted_steps(model_config, mesh, "train", tx=tx, config=run.step_config(oc))
    abstract_params = None
  else:  # LoRA (rstar_jax/models/lora.py): frozen base + trainable adapters
    abstract_params = lora.abstract_params(model_config, lora_cfg, run.model.param_dtype)
    tx = lora_training.optimizer(tx, abstract_params)
    js = steps.make_lora_jitted_steps(
      model_config,
      lora_cfg,
      mesh,
      tx=tx,
      config=run.step_config(oc),
      param_dtype=run.model.param_dtype,
    )
  if check_memory and run.mode in ("rl", "sft"):
    # Issue 29: a batch that cannot fit is one line, before anything is allocated.
    abstract = (
      plan.abstract_state(model_config, tx, run.model.param_dtype)
      if abstract_params is None
      else jax.eval_shape(lambda p: TrainState.create(p, tx, 0), abstract_params)
    )
    fit.check_learner_fits(run, js, abstract, model_config)
  if params is None:
    params = initial_params(run, model_config, mesh)
  else:
    # The steps donate the state: copy so the caller's arrays (e.g. the SFT result) survive.
    params = jax.tree.map(jnp.copy, params)
  if lora_cfg is not None:
    params = lora.make_params(params, model_config, lora_cfg, jax.random.key(run.train.seed + 1))
  state = js.shard_state(TrainState.create(params, tx, run.train.seed))
  push_adapters = lora_cfg is not None and run.rollout.lora_push == "adapters"
  return Learner(model_config, oc, tx, js, state, push_adapters=push_adapters)


def build_learner_for_restore(run: RunConfig) -> Learner:
  """A Learner whose state has the right structure to restore a checkpoint into (the schedule
  length does not change the optimizer state's structure, so a cosine schedule without
  ``total_steps`` gets a placeholder)."""
  total = None
  if run.optim.schedule == "cosine" and not run.optim.total_steps:
    total = run.optim.warmup_steps + 1
  return build_learner(run, total_steps=total, check_memory=False)  # restores, never steps


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
    # With a router the workers are read from it (every process pushes to all of them).
    [] if r.router_url else fleet.process_urls(list(r.sglang_urls)),
    staging_dir=fleet.process_staging_dir(r.staging_dir),
    weight_transport=r.weight_transport,
    weight_delta=r.weight_delta,
    colocated=r.colocated,
    server_timeout_s=r.server_timeout_s,
    health_interval_s=r.health_interval_s,
    health_timeout_s=r.health_timeout_s,
    max_server_failures=r.max_server_failures,
    router_url=r.router_url or None,
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
) -> tuple[Sequence[Problem], Sequence[Problem] | None, Any, Learner]:
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
  learner = build_learner(run, params=params)
  data_sources.check_vocab(tokenizer, learner.model_config)
  return problems, eval_problems, tokenizer, learner
