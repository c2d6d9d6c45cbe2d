"""Builds the run's objects from a typed `RunConfig`: model, mesh, optimizer, jitted steps, state.

Everything here is setup; the loops (`rl_loop`, `sft_loop`, `evaluation`) only use the objects.
Where the policy comes from (``config.model``):
  * ``hf_dir`` non-empty: an HF directory (config.json + safetensors [+ tokenizer.json]);
  * otherwise a tiny Qwen3 built from the ``model`` dims and randomly initialised from
    ``train.seed`` (CPU demo, tests).
``model.tokenizer_dir`` (optional) names a directory holding ``tokenizer.json``; default: the
HF dir.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import jax
import jax.numpy as jnp

from rstar_jax.config import RunConfig
from rstar_jax.learner import optim, steps
from rstar_jax.learner.batch import length_bucket  # noqa: F401 (the loops' padding rule)
from rstar_jax.learner.train_state import TrainState
from rstar_jax.models import lora, qwen3
from rstar_jax.sharding.mesh import make_mesh

log = logging.getLogger(__name__)


def maybe_initialize_distributed() -> bool:
  """``jax.distributed.initialize()`` when a multi-host environment is detected.

  Detected from the variables JAX's own cluster detection or common launchers set
  (coordinator address, SLURM, Open MPI, Kubernetes JobSet / TPU pods), or the ``RSTAR_*``
  variables of `scripts/local_cluster.sh` (`rstar_jax.distributed.init`). Returns whether it ran.
  """
  from rstar_jax.distributed import init as dist_init  # [multi-process]

  if dist_init.initialize_from_env():
    return True
  keys = (
    "JAX_COORDINATOR_ADDRESS",
    "COORDINATOR_ADDRESS",
    "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_SIZE",
    "JOBSET_NAME",
    "MEGASCALE_COORDINATOR_ADDRESS",
  )
  num = (
    os.getenv("JAX_NUM_PROCESSES") or os.getenv("SLURM_NTASKS") or os.getenv("OMPI_COMM_WORLD_SIZE")
  )
  if not any(k in os.environ for k in keys):
    return False
  if num is not None and int(num) <= 1:
    return False
  jax.distributed.initialize()
  log.info(
    "jax.distributed initialised: process %d of %d", jax.process_index(), jax.process_count()
  )
  return True


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
    tx = lora.optimizer(tx, abstract_params)
    js = lora.make_jitted_steps(
      model_config,
      lora_cfg,
      mesh,
      tx=tx,
      config=run.step_config(oc),
      param_dtype=run.model.param_dtype,
    )
  if check_memory and run.mode in ("rl", "sft"):
    from rstar_jax.planning import fit, plan  # issue 29: a batch that cannot fit is one line

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


def load_tokenizer(path: str):
  """The policy's tokenizer from a directory (tokenizer.json + config) via transformers."""
  from rstar_jax.tokenization import bpe

  if not path:
    raise ValueError(
      "tokenizer: config.model.tokenizer_dir and model.hf_dir are both empty; "
      "a from-scratch model needs a tokenizer directory"
    )
  return bpe.load_tokenizer(path)


def check_vocab(tokenizer, model_config: qwen3.Qwen3Config) -> None:
  """Every tokenizer id must index the embedding table."""
  n = len(tokenizer)
  if n > model_config.vocab_size:
    raise ValueError(
      f"tokenizer has {n} tokens but the model's vocab_size is "
      f"{model_config.vocab_size} (config.model.vocab_size)"
    )


def export_checkpoint(
  run: RunConfig,
  checkpoint_dir: str,
  out_dir: str,
  *,
  tokenizer_path: str = "",
  step: int | None = None,
  adapters_only: bool = False,
  dtype: str | None = None,
) -> int:
  """Writes the params of an orbax checkpoint (latest, or ``step``) as an HF directory, with
  the tokenizer from ``tokenizer_path`` (default: the config's) carrying the run's chat
  template, and generation_config.json with the run's stop ids (`hf_export`). Tensors are
  ``dtype`` (None = the source's: `hf_export.source_dtype`). Returns the exported step.

  A LoRA run (``model.lora_rank > 0``) exports the merged model, or with ``adapters_only``
  the adapters in PEFT's format (``adapter_config.json`` + ``adapter_model.safetensors``)."""
  from rstar_jax.learner.checkpoint import Checkpointer, export_hf
  from rstar_jax.pipelines import hf_export

  dtype = hf_export.export_dtype(run, dtype)
  learner = build_learner_for_restore(run)
  if adapters_only and not lora.is_lora(learner.state.params):
    raise ValueError("export_hf --adapters_only: the run has no adapters (model.lora_rank is 0)")
  with Checkpointer(checkpoint_dir) as ck:
    learner.state, meta = ck.restore(learner.state, step)
  if adapters_only:
    from rstar_jax.distributed.primary import is_primary

    if is_primary():
      lora.save_peft(out_dir, learner.state.params)
    return int(meta["step"])
  export_hf(out_dir, learner.model_config, learner.state.params, dtype=dtype)
  tok_path = tokenizer_path or run.tokenizer_dir()
  from rstar_jax.distributed.primary import is_primary  # [multi-process] one writer

  if tok_path and is_primary():
    hf_export.write_tokenizer_and_generation_config(out_dir, run, load_tokenizer(tok_path))
  return int(meta["step"])


def setup_logging(level: int = logging.INFO) -> None:
  """Launcher logging: our progress at INFO, orbax/absl chatter at WARNING."""
  logging.basicConfig(
    level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
  )
  for name in ("absl", "orbax", "jax", "jax._src"):
    logging.getLogger(name).setLevel(logging.WARNING)
  try:
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)
  except ImportError:  # pragma: no cover
    pass


def summary_json(d: dict) -> str:
  """The JSON-serialisable part of a loop's summary dict (objects like the learner dropped)."""
  import json

  out = {}
  for k, v in d.items():
    try:
      json.dumps(v)
    except TypeError:
      continue
    out[k] = v
  return json.dumps(out, indent=1, sort_keys=True)


def build_learner_for_restore(run: RunConfig) -> Learner:
  """A Learner whose state has the right structure to restore a checkpoint into (the schedule
  length does not change the optimizer state's structure, so a cosine schedule without
  ``total_steps`` gets a placeholder)."""
  total = None
  if run.optim.schedule == "cosine" and not run.optim.total_steps:
    total = run.optim.warmup_steps + 1
  return build_learner(run, total_steps=total, check_memory=False)  # restores, never steps
