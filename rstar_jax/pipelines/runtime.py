"""Builds the run's objects from a validated config: model, mesh, optimizer, jitted steps, state.

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
import ml_collections

from rstar_jax.learner import optim, steps
from rstar_jax.learner.train_state import TrainState
from rstar_jax.models import qwen3
from rstar_jax.sharding.mesh import make_mesh

log = logging.getLogger(__name__)


def maybe_initialize_distributed() -> bool:
  """``jax.distributed.initialize()`` when a multi-host environment is detected.

  Detected from the variables JAX's own cluster detection or common launchers set
  (coordinator address, SLURM, Open MPI, Kubernetes JobSet / TPU pods). Returns whether it ran.
  """
  keys = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS", "SLURM_JOB_ID",
          "OMPI_COMM_WORLD_SIZE", "JOBSET_NAME", "MEGASCALE_COORDINATOR_ADDRESS")
  num = os.environ.get("JAX_NUM_PROCESSES") or os.environ.get("SLURM_NTASKS") or \
      os.environ.get("OMPI_COMM_WORLD_SIZE")
  if not any(k in os.environ for k in keys):
    return False
  if num is not None and int(num) <= 1:
    return False
  jax.distributed.initialize()
  log.info("jax.distributed initialised: process %d of %d", jax.process_index(),
           jax.process_count())
  return True


def model_config_from(cfg: ml_collections.ConfigDict) -> qwen3.Qwen3Config:
  """Qwen3Config from ``cfg.model`` (HF dir or tiny dims)."""
  m = cfg.model
  if m.hf_dir:
    return qwen3.Qwen3Config.from_hf(m.hf_dir, dtype=m.dtype, remat=m.remat, **_attention(m))
  return qwen3.Qwen3Config(
      vocab_size=m.vocab_size, hidden_size=m.hidden_size,
      intermediate_size=m.intermediate_size, num_hidden_layers=m.num_hidden_layers,
      num_attention_heads=m.num_attention_heads, num_key_value_heads=m.num_key_value_heads,
      head_dim=m.head_dim, rope_theta=float(m.rope_theta),
      rms_norm_eps=float(m.get("rms_norm_eps", 1e-6)),
      tie_word_embeddings=m.tie_word_embeddings,
      max_position_embeddings=m.max_position_embeddings, dtype=m.dtype, remat=m.remat,
      **_attention(m))


def _attention(m) -> dict:
  """model.attention / attention_block_size (configs without them keep the defaults)."""
  return {k: m[k] for k in ("attention", "attention_block_size") if k in m}


def optim_config_from(cfg: ml_collections.ConfigDict, total_steps: int | None = None
                      ) -> optim.OptimConfig:
  o = cfg.optim
  total = total_steps if total_steps is not None else (o.total_steps or None)
  return optim.OptimConfig(
      learning_rate=float(o.lr), b1=float(o.b1), b2=float(o.b2), eps=float(o.eps),
      weight_decay=float(o.weight_decay), grad_clip_norm=float(o.grad_clip) or None,
      warmup_steps=int(o.warmup_steps), schedule=o.schedule, total_steps=total)


def mesh_from(cfg: ml_collections.ConfigDict) -> jax.sharding.Mesh:
  """The learner mesh; ``mesh.num_devices`` (optional, 0 = all) uses only the first n devices."""
  n = int(cfg.mesh.get("num_devices", 0) or 0)
  devices = jax.devices()[:n] if n else None
  return make_mesh({k: int(cfg.mesh[k]) for k in ("data", "fsdp", "tensor")}, devices)


def length_bucket(longest: int, minimum: int = 64) -> int:
  """Smallest power of two >= max(longest, minimum): a batch's padded length T (one compiled
  step per bucket instead of one per length)."""
  t = max(int(longest), minimum, 2)
  return 1 << (t - 1).bit_length()


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

  @property
  def row_multiple(self) -> int:
    return data_parallel_size(self.jitted) * self.jitted.num_micro_batches

  def params_copy(self):
    """A copy of the params that survives the next (donating) step, e.g. for the sampler."""
    return jax.tree.map(jnp.copy, self.state.params)


def initial_params(cfg: ml_collections.ConfigDict, model_config: qwen3.Qwen3Config,
                   mesh=None):
  dtype = jnp.dtype(cfg.model.param_dtype)
  if cfg.model.hf_dir:
    return qwen3.load_hf_params(cfg.model.hf_dir, model_config, mesh=mesh, dtype=dtype)
  return qwen3.init_params(model_config, jax.random.key(int(cfg.train.seed)), dtype=dtype)


LOSS_AGG = {"token-mean": "token-mean", "seq-mean": "seq-mean-token-mean",
            "seq-mean-token-mean": "seq-mean-token-mean",
            "seq-mean-token-sum": "seq-mean-token-sum"}


def step_config_from(cfg: ml_collections.ConfigDict, oc: optim.OptimConfig) -> steps.StepConfig:
  """Learner step settings: micro-batches from ``train``, the policy loss from ``rl``."""
  kw = dict(num_micro_batches=int(cfg.train.micro_batches), optim=oc)
  if "rl" in cfg:
    rl = cfg.rl
    kw.update(eps_low=float(rl.eps_low), eps_high=float(rl.eps_high),
              dual_clip_c=float(rl.dual_clip_c) or None, entropy_coef=float(rl.entropy_coef),
              agg=LOSS_AGG[rl.loss_agg])
  return steps.StepConfig(**kw)


def build_learner(cfg: ml_collections.ConfigDict, *, total_steps: int | None = None,
                  params=None) -> Learner:
  """Model config, optimizer, jitted steps on the config's mesh, and a fresh sharded state."""
  model_config = model_config_from(cfg)
  oc = optim_config_from(cfg, total_steps)
  tx = optim.make_optimizer(oc)
  mesh = mesh_from(cfg)
  js = steps.make_jitted_steps(model_config, mesh, "train", tx=tx,
                               config=step_config_from(cfg, oc))
  if params is None:
    params = initial_params(cfg, model_config, mesh)
  else:
    # The steps donate the state: copy so the caller's arrays (e.g. the SFT result) survive.
    params = jax.tree.map(jnp.copy, params)
  state = js.shard_state(TrainState.create(params, tx, int(cfg.train.seed)))
  return Learner(model_config, oc, tx, js, state)


def tokenizer_dir(cfg: ml_collections.ConfigDict) -> str:
  return cfg.model.get("tokenizer_dir", "") or cfg.model.hf_dir


def load_tokenizer(path: str):
  """The policy's tokenizer from a directory (tokenizer.json + config) via transformers."""
  from rstar_jax.tokenization import bpe
  if not path:
    raise ValueError("tokenizer: config.model.tokenizer_dir and model.hf_dir are both empty; "
                     "a from-scratch model needs a tokenizer directory")
  return bpe.load_tokenizer(path)


def check_vocab(tokenizer, model_config: qwen3.Qwen3Config) -> None:
  """Every tokenizer id must index the embedding table."""
  n = len(tokenizer)
  if n > model_config.vocab_size:
    raise ValueError(f"tokenizer has {n} tokens but the model's vocab_size is "
                     f"{model_config.vocab_size} (config.model.vocab_size)")


def export_checkpoint(cfg: ml_collections.ConfigDict, checkpoint_dir: str, out_dir: str, *,
                      tokenizer_path: str = "", step: int | None = None) -> int:
  """Writes the params of an orbax checkpoint (latest, or ``step``) as an HF directory, with
  the tokenizer from ``tokenizer_path`` (default: the config's). Returns the exported step."""
  from rstar_jax.learner.checkpoint import Checkpointer, export_hf
  learner = build_learner_for_restore(cfg)
  with Checkpointer(checkpoint_dir) as ck:
    learner.state, meta = ck.restore(learner.state, step)
  export_hf(out_dir, learner.model_config, learner.state.params)
  tok_path = tokenizer_path or tokenizer_dir(cfg)
  if tok_path:
    load_tokenizer(tok_path).save_pretrained(out_dir)
  return int(meta["step"])


def setup_logging(level: int = logging.INFO) -> None:
  """Launcher logging: our progress at INFO, orbax/absl chatter at WARNING."""
  logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                      force=True)
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


def build_learner_for_restore(cfg: ml_collections.ConfigDict) -> Learner:
  """A Learner whose state has the right structure to restore a checkpoint into (the schedule
  length does not change the optimizer state's structure, so a cosine schedule without
  ``total_steps`` gets a placeholder)."""
  total = None
  if cfg.optim.schedule == "cosine" and not cfg.optim.total_steps:
    total = int(cfg.optim.warmup_steps) + 1
  return build_learner(cfg, total_steps=total)
