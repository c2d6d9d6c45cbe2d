"""Pure learner steps: ``sft_step`` and ``rl_step`` (state, batch) -> (state, metrics).

Batch layout (built by `rstar_jax.learner.batch`; N rows, T columns, right-padded):

  input_ids      int32   [N, T]
  attention_mask int32   [N, T]  1 = real token
  loss_mask      float32 [N, T]  1 = train on this token (RL: model-generated response tokens)
  old_logprobs   float32 [N, T]  RL only: behaviour-policy log-prob of input_ids[:, t]
  advantages     float32 [N]     RL only (or [N, T] per token, e.g. packed rows)
  segment_ids    int32   [N, T]  optional, packed rows (`rstar_jax.learner.packing`): tokens
                                 attend only within their segment; 0 = padding
  positions      int32   [N, T]  optional, with segment_ids: position within the segment
  behaviour_logprobs float32 [N, T]  RL with StepConfig.tis_cap only: the sampler's log-probs
                                 (old_logprobs are then the learner's recomputed ones)

Target convention ("token-aligned"): column t of loss_mask / old_logprobs / the returned
log-probs is about token ``input_ids[:, t]``, predicted by the logits at column ``t - 1``.
Column 0 is never a target.

Exact token-mean under gradient accumulation: the loss normaliser is the loss-mask token count
of the WHOLE batch, computed before the micro-batch loop; each micro-batch contributes
``sum(per-token loss * mask) / total``, so the summed gradient is exactly the gradient of the
whole-batch token-mean (the released verl code approximates it per micro-batch; we do not copy
that). Micro-batch j holds rows n with ``n % M == j`` (a strided split), so with the rows sharded
over the data axes every device works on every micro-batch.

Losses come from ``rstar_jax.rl.losses`` (``sft_loss``; the policy loss named in StepConfig,
default "grpo_roc": PPO-clip with Clip-Higher 0.2/0.28, no KL, no entropy term), called with the
whole-batch normaliser. Metrics come back as scalars (float32 []), each the exact ratio of the
(numerator, denominator) sums over the whole batch (STYLE convention 9): the losses' metrics
(SFT: loss, entropy, accuracy; RL: loss, pg_loss, clip_frac[_low/_high], dual_clip_frac,
approx_kl, ppo_kl, ratio_mean, ratio_abs_dev, entropy) plus ``grad_norm`` (before clipping),
``num_tokens`` and ``learning_rate`` (the one this update used; with StepConfig.optim).

Old log-probs: the host batch carries the sampler's log-probs (``sampler_logprobs``);
`step_inputs(batch, config, proximal)` makes the step's ``old_logprobs`` from the learner's own
(`compute_logprobs`, recomputed after RoC as verl does) or the sampler's, and
``behaviour_logprobs`` for an off-policy loss, and reports `logprob_drift` (the
sampler/trainer mismatch) and, for groups from older weights, the importance ratios.
Log-probs and entropies come from the one `rstar_jax.rl.losses.token_logprobs_and_entropy`
(prediction-aligned); the learner shifts by one column to the token-aligned layout above.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from rstar_jax.distributed import hostdata
from rstar_jax.learner import batch as batch_lib
from rstar_jax.learner import lora_training, optim
from rstar_jax.learner.batch import BEHAVIOUR_KEY, OLD_KEY, SAMPLER_KEY
from rstar_jax.learner.packing import PACKING_KEYS
from rstar_jax.learner.train_state import TrainState
from rstar_jax.models import lora, qwen3
from rstar_jax.rl import losses, off_policy, registry  # noqa: F401 (off_policy registers its losses)
from rstar_jax.sharding.mesh import use_mesh
from rstar_jax.sharding.rules import Rules, activation_layout, get_rules

Batch = Mapping[str, jax.Array]
Metrics = dict[str, jax.Array]

SFT_KEYS = ("input_ids", "attention_mask", "loss_mask")
RL_KEYS = SFT_KEYS + (OLD_KEY, "advantages")
# BEHAVIOUR_KEY (the sampler's per-token log-probs [N, T]) is read by the off-policy losses when
# StepConfig.tis_cap is set; OLD_KEY then holds the learner's recomputed ones
# (`batch.rl_inputs` builds both from the host batch). PACKING_KEYS are optional: packed rows.

# (params, input_ids [B,T] int32, attention_mask [B,T]) -> logits [B,T,V] float32; for packed
# batches it is also called with keyword arguments segment_ids= and positions= ([B,T] int32).
ApplyFn = Callable[[Any, jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepConfig:
  """Static settings of a learner step (frozen, hashable).

  Attributes:
      num_micro_batches: M; the batch's N rows are split into M strided micro-batches whose
          gradients are accumulated (N must be a multiple of M).
      policy_loss: name of the policy loss in ``rstar_jax.rl.registry`` ("grpo_roc").
      sft_loss: name of the SFT loss in ``rstar_jax.rl.registry`` ("nll").
      eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high] (rStar2-Agent: 0.2 / 0.28).
      dual_clip_c: dual-clip bound for negative advantages (released verl code: 3.0); None off.
      entropy_coef: entropy bonus weight (paper: 0).
      agg: loss aggregation, "token-mean" (paper) or "seq-mean-token-mean" /
          "seq-mean-token-sum"; for the seq-mean variants the normaliser is the number of
          rows of the whole batch with at least one loss token.
      optim: the OptimConfig the state's ``tx`` was built from; used only to report the
          learning rate of each update. None omits the ``learning_rate`` metric.
      tis_cap: C of the importance weight between the sampler's and the learner's
          log-probs (ASTER: 2.0 with token-level truncated IS); the RL batch then needs
          ``behaviour_logprobs`` [N, T] (the sampler's) next to ``old_logprobs`` (the
          learner's recomputed ones) and the loss is ``off_policy_loss``. None = off.
      off_policy_loss: name in ``rstar_jax.rl.registry`` kind "off_policy_loss" used when
          ``tis_cap`` is set: "tis" (w = min(rho, C)) or "decoupled_ppo" (AReaL,
          w = rho * 1[rho <= C]); `rstar_jax.rl.off_policy`.
  """

  num_micro_batches: int = 1
  policy_loss: str = "grpo_roc"
  sft_loss: str = "nll"
  eps_low: float = 0.2
  eps_high: float = 0.28
  dual_clip_c: float | None = None
  entropy_coef: float = 0.0
  agg: str = "token-mean"
  optim: optim.OptimConfig | None = None
  tis_cap: float | None = None
  off_policy_loss: str = "tis"

  def __post_init__(self):
    def bad(field, expected):
      raise ValueError(f"StepConfig.{field}: expected {expected}, got {getattr(self, field)!r}")

    if not isinstance(self.num_micro_batches, int) or self.num_micro_batches < 1:
      bad("num_micro_batches", "an int >= 1")
    if self.policy_loss not in registry.names("policy_loss"):
      bad("policy_loss", f"one of {registry.names('policy_loss')}")
    if self.sft_loss not in registry.names("sft_loss"):
      bad("sft_loss", f"one of {registry.names('sft_loss')}")
    if not 0.0 <= self.eps_low < 1.0:
      bad("eps_low", "a float in [0, 1)")
    if not self.eps_high >= 0.0:
      bad("eps_high", "a float >= 0")
    if self.dual_clip_c is not None and not self.dual_clip_c > 1.0:
      bad("dual_clip_c", "None or a float > 1")
    if self.agg not in losses.AGGREGATIONS:
      bad("agg", f"one of {losses.AGGREGATIONS}")
    if self.tis_cap is not None and not self.tis_cap >= 1.0:
      bad("tis_cap", "None or a float >= 1")
    if self.off_policy_loss not in registry.names("off_policy_loss"):
      bad("off_policy_loss", f"one of {registry.names('off_policy_loss')}")

  @property
  def rl_keys(self) -> tuple[str, ...]:
    """Batch keys `rl_step` reads (the behaviour log-probs only with an off-policy loss)."""
    return RL_KEYS + ((BEHAVIOUR_KEY,) if self.tis_cap is not None else ())


def check_batch(batch: Batch, keys: tuple[str, ...], num_micro_batches: int = 1) -> None:
  """Raises ValueError naming the key and shape when ``batch`` does not fit the layout."""
  missing = [k for k in keys if k not in batch]
  if missing:
    raise ValueError(f"batch is missing {missing} (has {sorted(batch)}); expected {list(keys)}")
  n, t = batch["input_ids"].shape
  for k in keys + tuple(k for k in PACKING_KEYS if k in batch):
    want = [(n,), (n, t)] if k == "advantages" else [(n, t)]
    if tuple(batch[k].shape) not in want:
      raise ValueError(
        f"batch[{k!r}]: expected shape {' or '.join(map(str, want))}, got {tuple(batch[k].shape)}"
      )
  if ("segment_ids" in batch) != ("positions" in batch):
    raise ValueError(
      "batch: segment_ids and positions come together (packed rows); got "
      f"only {[k for k in PACKING_KEYS if k in batch]}"
    )
  if n % num_micro_batches:
    raise ValueError(f"batch has {n} rows, not a multiple of num_micro_batches={num_micro_batches}")


def _token_aligned(logits: jax.Array, input_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
  """`losses.token_logprobs_and_entropy` on causal-LM logits, re-indexed to the batch layout:
  column t is about ``input_ids[:, t]`` (predicted by ``logits[:, t - 1]``); column 0 is 0.
  logits [B, T, V], input_ids [B, T] -> logp, entropy [B, T] float32."""
  logp, ent = losses.token_logprobs_and_entropy(logits[:, :-1], input_ids[:, 1:])
  pad = jnp.zeros_like(logp[:, :1])
  return jnp.concatenate([pad, logp], 1), jnp.concatenate([pad, ent], 1)


def _target_mask(loss_mask: jax.Array) -> jax.Array:
  """float32 mask with column 0 forced to 0 (nothing predicts the first token)."""
  mask = jnp.asarray(loss_mask, jnp.float32)
  return mask.at[:, 0].set(0.0)


def _normaliser(mask: jax.Array, agg: str) -> jax.Array:
  """Whole-batch denominator: mask tokens (token-mean) or rows with a token (seq-mean-*)."""
  if agg == "token-mean":
    count = jnp.sum(mask)
  else:
    count = jnp.sum((jnp.sum(mask, axis=-1) > 0).astype(jnp.float32))
  return jnp.maximum(count, 1.0)


def _apply(apply_fn, params, mb):
  if "segment_ids" in mb:
    return apply_fn(
      params,
      mb["input_ids"],
      mb["attention_mask"],
      segment_ids=mb["segment_ids"],
      positions=mb["positions"],
    )
  return apply_fn(params, mb["input_ids"], mb["attention_mask"])


def _with_packing(batch: Batch, keys: tuple[str, ...]) -> dict[str, jax.Array]:
  return {k: batch[k] for k in keys + PACKING_KEYS if k in batch}


def _sft_micro_loss(apply_fn, params, mb, normaliser, cfg: StepConfig):
  logits = _apply(apply_fn, params, mb)
  mask = _target_mask(mb["loss_mask"])
  loss_fn = registry.get("sft_loss", cfg.sft_loss)
  return loss_fn(logits[:, :-1], mb["input_ids"][:, 1:], mask[:, 1:], normalizer=normaliser)


def _rl_micro_loss(apply_fn, params, mb, normaliser, cfg: StepConfig):
  logits = _apply(apply_fn, params, mb)
  logp, ent = _token_aligned(logits, mb["input_ids"])
  kw = dict(
    eps_low=cfg.eps_low,
    eps_high=cfg.eps_high,
    dual_clip_c=cfg.dual_clip_c,
    entropy_coef=cfg.entropy_coef,
    entropy=ent,
    agg=cfg.agg,
    normalizer=normaliser,
  )
  if cfg.tis_cap is not None:
    off_fn = registry.get("off_policy_loss", cfg.off_policy_loss)
    return off_fn(
      logp,
      mb["old_logprobs"],
      mb[BEHAVIOUR_KEY],
      mb["advantages"],
      _target_mask(mb["loss_mask"]),
      cap=cfg.tis_cap,
      **kw,
    )
  loss_fn = registry.get("policy_loss", cfg.policy_loss)
  return loss_fn(logp, mb["old_logprobs"], mb["advantages"], _target_mask(mb["loss_mask"]), **kw)


def _split_micro(x: jax.Array, m: int) -> jax.Array:
  """[N, ...] -> [M, N/M, ...]; micro-batch j holds rows n with n % M == j."""
  n = x.shape[0]
  return jnp.swapaxes(x.reshape((n // m, m) + x.shape[1:]), 0, 1)


def _accumulate(loss_fn, params, batch: Batch, num_micro: int, micro_sharding):
  """Sums grads and (num, den) metrics of ``loss_fn(params, micro_batch)`` over micro-batches.

  Gradients are accumulated in float32 (bf16 sums over many micro-batches lose mass) and cast
  back to each param's dtype so the optimizer state keeps its dtypes.
  """
  split = lora_training.split_trainable(params)
  if split is not None:  # LoRA: differentiate the adapters only; the frozen base gets zeros
    trainable, rebuild, full_grads = split
    g, sums = _accumulate(
      lambda t, mb: loss_fn(rebuild(t), mb), trainable, batch, num_micro, micro_sharding
    )
    return full_grads(g), sums
  grad_fn = jax.grad(loss_fn, has_aux=True)
  if num_micro == 1:
    return grad_fn(params, batch)
  micro = {k: _split_micro(v, num_micro) for k, v in batch.items()}

  def body(carry, mb):
    if micro_sharding is not None:
      mb = {k: jax.lax.with_sharding_constraint(v, micro_sharding(v)) for k, v in mb.items()}
    grads, sums = carry
    g, m = grad_fn(params, mb)
    grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
    return (grads, losses.add_metric_sums(sums, m)), None

  first = jax.tree.map(lambda v: v[0], micro)
  grads_shape, sums_shape = jax.eval_shape(grad_fn, params, first)
  zeros = (
    jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), grads_shape),
    jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), sums_shape),
  )
  (grads, sums), _ = jax.lax.scan(body, zeros, micro)
  return jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params), sums


def _finish(state: TrainState, grads, sums, num_tokens, cfg: StepConfig):
  metrics = losses.reduce_metrics(sums)
  metrics["grad_norm"] = optax.global_norm(grads)
  metrics["num_tokens"] = num_tokens
  if cfg.optim is not None:
    metrics["learning_rate"] = optim.current_learning_rate(cfg.optim, state.opt_state)
  return state.apply_gradients(grads), metrics


def sft_step(
  state: TrainState,
  batch: Batch,
  *,
  apply_fn: ApplyFn,
  config: StepConfig = StepConfig(),
  micro_sharding: Callable[[jax.Array], Any] | None = None,
) -> tuple[TrainState, Metrics]:
  """One SFT update: token-mean negative log-likelihood over loss_mask tokens.

  Args:
      state: TrainState.
      batch: SFT batch (module docstring), N a multiple of ``config.num_micro_batches``.
      apply_fn: (params, input_ids, attention_mask) -> logits [B, T, V].
      config: static step settings.
      micro_sharding: optional array -> sharding for each micro-batch array (keeps rows on the
          data axes inside the accumulation loop); None lets the compiler choose.
  Returns:
      (new state, metrics: loss, entropy, grad_norm, num_tokens[, learning_rate]).
  """
  check_batch(batch, SFT_KEYS, config.num_micro_batches)
  batch = _with_packing(batch, SFT_KEYS)
  mask = _target_mask(batch["loss_mask"])
  norm = _normaliser(mask, "token-mean")
  loss_fn = lambda p, mb: _sft_micro_loss(apply_fn, p, mb, norm, config)
  grads, sums = _accumulate(loss_fn, state.params, batch, config.num_micro_batches, micro_sharding)
  return _finish(state, grads, sums, jnp.sum(mask), config)


def rl_step(
  state: TrainState,
  batch: Batch,
  *,
  apply_fn: ApplyFn,
  config: StepConfig = StepConfig(),
  micro_sharding: Callable[[jax.Array], Any] | None = None,
) -> tuple[TrainState, Metrics]:
  """One GRPO-RoC policy update: clipped surrogate, token-mean over the whole batch.

  Args/returns as `sft_step`, with the RL batch; metrics add the policy-loss statistics.
  """
  keys = config.rl_keys
  check_batch(batch, keys, config.num_micro_batches)
  if "segment_ids" in batch and config.agg != "token-mean":
    raise ValueError(
      f"rl_step: agg={config.agg!r} aggregates per row, which is not per "
      "trajectory on packed rows; use agg='token-mean' or unpacked rows"
    )
  batch = _with_packing(batch, keys)
  mask = _target_mask(batch["loss_mask"])
  norm = _normaliser(mask, config.agg)
  loss_fn = lambda p, mb: _rl_micro_loss(apply_fn, p, mb, norm, config)
  grads, sums = _accumulate(loss_fn, state.params, batch, config.num_micro_batches, micro_sharding)
  return _finish(state, grads, sums, jnp.sum(mask), config)


def compute_logprobs(
  params, batch: Batch, *, apply_fn: ApplyFn, num_micro_batches: int = 1
) -> jax.Array:
  """Token-aligned log-probs [N, T] float32 of ``batch['input_ids']`` under ``params``.

  Used to recompute old log-probs after RoC instead of trusting the sampler's. Column 0 is 0;
  padding columns hold the (meaningless) log-prob of the pad id: multiply by loss_mask.
  """
  check_batch(batch, ("input_ids", "attention_mask"), num_micro_batches)

  def one(mb):
    return _token_aligned(_apply(apply_fn, params, mb), mb["input_ids"])[0]

  mb_in = _with_packing(batch, ("input_ids", "attention_mask"))
  if num_micro_batches == 1:
    return one(mb_in)
  out = jax.lax.map(one, {k: _split_micro(v, num_micro_batches) for k, v in mb_in.items()})
  # Undo the strided split: [M, N/M, T] -> [N/M, M, T] -> [N, T].
  return jnp.swapaxes(out, 0, 1).reshape(batch["input_ids"].shape)


def with_old_logprobs(batch: Batch, logprobs: jax.Array) -> dict[str, jax.Array]:
  """The batch with old_logprobs replaced by ``logprobs`` [N, T] (zeroed off the loss mask)."""
  out = dict(batch)
  out["old_logprobs"] = logprobs * batch["loss_mask"].astype(logprobs.dtype)
  return out


def logprob_drift(
  sampler_logprobs: jax.Array, learner_logprobs: jax.Array, loss_mask: jax.Array
) -> dict[str, jax.Array]:
  """Sampler-vs-learner log-prob mismatch over loss tokens (all inputs [N, T]).

  Returns float32 scalars: ``logprob_abs_diff`` (mean |a - b|), ``logprob_max_abs_diff`` and
  ``logprob_diff`` (mean of learner - sampler).
  """
  mask = _target_mask(loss_mask)
  d = (learner_logprobs - sampler_logprobs) * mask
  n = jnp.maximum(jnp.sum(mask), 1.0)
  return {
    "logprob_abs_diff": jnp.sum(jnp.abs(d)) / n,
    "logprob_max_abs_diff": jnp.max(jnp.abs(d)),
    "logprob_diff": jnp.sum(d) / n,
  }


def step_inputs(
  batch: Mapping[str, np.ndarray],
  config: StepConfig,
  proximal: np.ndarray | None = None,
  *,
  older_weights: bool = False,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
  """The RL step's host inputs from a `batch.make_rl_batch` batch, and the contract's metrics.

  The one place the sampler's log-probs (``batch.SAMPLER_KEY``) turn into step inputs: the keys
  ``config.rl_keys`` names (`batch.rl_inputs`), the truncation cap read from ``config.tis_cap``.

  Args:
    batch: host batch (packed or not) with ``sampler_logprobs`` [N, T].
    config: the step's static settings (the `JittedSteps.config` the step was built with).
    proximal: [N, T] the learner's recomputed log-probs, or None (the sampler's are old).
    older_weights: the groups may come from older weights (an asynchronous source): adds the
      importance ratios of the sampler's log-probs against ``proximal``.
  Returns:
    (inputs, metrics): ``sampler_logprob_drift`` when ``proximal`` is given, plus
    ``async/is_ratio_*`` (`batch.importance_metrics`) when ``older_weights``.
  """
  inputs = batch_lib.rl_inputs(batch, config.rl_keys, proximal)  # checks the shapes first
  metrics: dict[str, float] = {}
  if proximal is not None:
    sampler = batch[SAMPLER_KEY]
    drift = logprob_drift(sampler, proximal, batch["loss_mask"])
    metrics["sampler_logprob_drift"] = float(drift["logprob_abs_diff"])
    if older_weights:
      cap = config.tis_cap or 0.0
      metrics.update(batch_lib.importance_metrics(sampler, proximal, batch["loss_mask"], cap))
  return inputs, metrics


# --------------------------------------------------------------------------------------------
# Sharded, jitted steps.


@dataclasses.dataclass(frozen=True)
class JittedSteps:
  """The learner steps compiled for one mesh, model and optimizer.

  Attributes:
      sft_step: (state, batch) -> (state, metrics); donates ``state``.
      rl_step: (state, batch) -> (state, metrics); donates ``state``.
      compute_logprobs: (params, batch) -> logp [N, T] token-aligned (RL old log-probs).
      state_shardings: a TrainState whose leaves are the NamedShardings of the live state.
      mesh: the mesh.
      data_axes: mesh axes the batch rows are sharded over.
      num_micro_batches: micro-batches per step (rows must divide by it x data size).
      config: the static step settings (``config.rl_keys``: the RL batch contract).
      rules: the sharding rules the steps were traced under.
      jitted: the ``jax.jit`` objects behind the three callables ("sft_step", "rl_step",
          "compute_logprobs"); `lower` lowers them as the callables run them (the planner
          compiles these very objects).
  """

  sft_step: Callable[[TrainState, Batch], tuple[TrainState, Metrics]]
  rl_step: Callable[[TrainState, Batch], tuple[TrainState, Metrics]]
  compute_logprobs: Callable[[Any, Batch], jax.Array]
  state_shardings: TrainState
  mesh: jax.sharding.Mesh
  data_axes: tuple[str, ...]
  num_micro_batches: int
  config: StepConfig = StepConfig()
  rules: Any = "train"
  jitted: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def lower(self, name: str, *args):
    """``self.jitted[name].lower(*args)`` under the mesh and activation layout the callables
    use (args: ShapeDtypeStructs with shardings, or arrays)."""
    with use_mesh(self.mesh), activation_layout(self.rules):
      return self.jitted[name].lower(*args)

  def batch_sharding(self, x) -> NamedSharding:
    """Rows over the data axes, everything else replicated."""
    spec = PartitionSpec(self.data_axes or None, *([None] * (len(x.shape) - 1)))
    return NamedSharding(self.mesh, spec)

  def shard_batch(self, batch: Batch) -> dict[str, jax.Array]:
    """Places a host batch on the mesh (rows over the data axes); checks divisibility."""
    n = batch["input_ids"].shape[0]
    dp = math.prod(self.mesh.shape[a] for a in self.data_axes)
    if n % (dp * self.num_micro_batches):
      raise ValueError(
        f"batch has {n} rows; it must be a multiple of data-parallel size {dp} x "
        f"num_micro_batches {self.num_micro_batches} = {dp * self.num_micro_batches} "
        "(pad with make_*_batch(row_multiple=...))"
      )
    if jax.process_count() > 1:  # [multi-process] each process places its own rows
      return hostdata.global_batch(batch, self.batch_sharding)
    return {k: jax.device_put(v, self.batch_sharding(v)) for k, v in batch.items()}

  def shard_state(self, state: TrainState) -> TrainState:
    """Places ``state`` (built with the same ``tx``) onto ``state_shardings``."""
    _check_tx(state, self.state_shardings)
    return jax.device_put(state, self.state_shardings)


def _check_tx(state: TrainState, shardings: TrainState) -> None:
  if state.tx is not shardings.tx:
    raise ValueError(
      "TrainState.tx is not the optimizer these steps were built with; build "
      "the state with the same tx object passed to make_jitted_steps"
    )


def state_shardings_for(
  params_shardings, tx: optax.GradientTransformation, abstract_params, replicated
) -> TrainState:
  """TrainState of shardings: optimizer-state copies of the params follow the params; the
  rest (counts, rng, step) is replicated."""
  abstract_opt = jax.eval_shape(tx.init, abstract_params)
  # A masked optimizer (LoRA: none for the frozen base) holds MaskedNode placeholders.
  masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731
  opt_shardings = optax.tree_map_params(
    tx,
    lambda v, s: v if masked(v) else s,
    abstract_opt,
    params_shardings,
    transform_non_params=lambda _: replicated,
    is_leaf=masked,
  )
  return TrainState(
    step=replicated, params=params_shardings, opt_state=opt_shardings, rng=replicated, tx=tx
  )


def _data_axes(rules, mesh) -> tuple[str, ...]:
  """Mesh axes (present, size > 1) that the "batch" logical axis maps to."""
  target = get_rules(rules).get("batch")
  axes = () if target is None else (target,) if isinstance(target, str) else tuple(target)
  return tuple(a for a in axes if mesh.shape.get(a, 1) > 1)


def make_jitted_steps_for(
  apply_fn: ApplyFn,
  params_shardings,
  abstract_params,
  tx: optax.GradientTransformation,
  mesh: jax.sharding.Mesh,
  *,
  rules: str | Rules = "train",
  config: StepConfig = StepConfig(),
) -> JittedSteps:
  """Model-agnostic core of `make_jitted_steps`: jit the steps with in/out shardings.

  Args:
      apply_fn: (params, input_ids, attention_mask) -> logits [B, T, V].
      params_shardings: pytree of NamedSharding matching the params.
      abstract_params: pytree of arrays / ShapeDtypeStructs matching the params (only the
          structure is used, to lay out the optimizer state).
      tx: the optimizer every state passed to the steps was built with.
      mesh: the device mesh.
      rules: sharding rules (layout name or mapping); the "batch" entry names the data axes.
      config: static step settings.
  """
  data_axes = _data_axes(rules, mesh)
  replicated = NamedSharding(mesh, PartitionSpec())
  state_sh = state_shardings_for(params_shardings, tx, abstract_params, replicated)

  def rows_sharding(x):
    return NamedSharding(mesh, PartitionSpec(data_axes or None, *([None] * (x.ndim - 1))))

  # One sharding for the whole batch dict (a pytree prefix): rows over the data axes, other
  # dims replicated, whatever the keys (packed batches add some) and ranks.
  batch_prefix = NamedSharding(mesh, PartitionSpec(data_axes or None))

  def traced_under_mesh(jitted):
    # The model's activation constraints (sharding.rules.constrain) apply only when the
    # mesh and rules are active while tracing.
    def call(*args):
      with use_mesh(mesh), activation_layout(rules):
        return jitted(*args)

    return call

  def jit(fn):
    step = functools.partial(fn, apply_fn=apply_fn, config=config, micro_sharding=rows_sharding)
    return jax.jit(
      step,
      in_shardings=(state_sh, batch_prefix),
      out_shardings=(state_sh, replicated),
      donate_argnums=(0,),
    )

  def run_step(jitted, keys):
    call = traced_under_mesh(jitted)

    def run(state, batch):
      _check_tx(state, state_sh)
      return call(state, _with_packing(batch, keys))

    return run

  jitted = {
    "sft_step": jit(sft_step),
    "rl_step": jit(rl_step),
    "compute_logprobs": jax.jit(
      functools.partial(
        compute_logprobs, apply_fn=apply_fn, num_micro_batches=config.num_micro_batches
      ),
      in_shardings=(params_shardings, batch_prefix),
      out_shardings=rows_sharding(jax.ShapeDtypeStruct((1, 1), jnp.float32)),
    ),
  }
  lp_keys = ("input_ids", "attention_mask")
  logprobs = traced_under_mesh(jitted["compute_logprobs"])

  return JittedSteps(
    sft_step=run_step(jitted["sft_step"], SFT_KEYS),
    rl_step=run_step(jitted["rl_step"], config.rl_keys),
    compute_logprobs=lambda params, batch: logprobs(params, _with_packing(batch, lp_keys)),
    state_shardings=state_sh,
    mesh=mesh,
    data_axes=data_axes,
    num_micro_batches=config.num_micro_batches,
    config=config,
    rules=rules,
    jitted=jitted,
  )


def make_jitted_steps(
  model_config,
  mesh: jax.sharding.Mesh,
  rules: str | Rules = "train",
  *,
  tx: optax.GradientTransformation,
  config: StepConfig = StepConfig(),
) -> JittedSteps:
  """`sft_step` / `rl_step` / `compute_logprobs` for a Qwen3 model, jitted on ``mesh``.

  Params and optimizer moments are sharded by ``qwen3.param_logical_axes`` under ``rules``
  (default the "train" layout: FSDP + tensor parallel); batch rows over the rules' "batch"
  axes; step, rng and counts replicated. The state argument of both steps is donated: do
  not reuse a state (or arrays it aliases, e.g. the params it was created from) after
  passing it in. Build states with `JittedSteps.shard_state(TrainState.create(params, tx, rng))`.
  """

  params_sh = qwen3.param_shardings(model_config, mesh, rules)
  abstract = jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s, jnp.float32),
    qwen3.param_shapes(model_config),
    is_leaf=lambda x: isinstance(x, tuple),
  )

  def apply_fn(params, input_ids, attention_mask, segment_ids=None, positions=None):
    return qwen3.forward(
      params,
      model_config,
      input_ids,
      positions=positions,
      attention_mask=attention_mask,
      segment_ids=segment_ids,
    )

  return make_jitted_steps_for(apply_fn, params_sh, abstract, tx, mesh, rules=rules, config=config)


def make_lora_jitted_steps(
  model_config,
  cfg: lora.LoraConfig,
  mesh: jax.sharding.Mesh,
  rules: str | Rules = "train",
  *,
  tx: optax.GradientTransformation,
  config: StepConfig = StepConfig(),
  param_dtype="float32",
) -> JittedSteps:
  """`make_jitted_steps` for a `lora.LoraParams` policy (``tx`` from
  `lora_training.optimizer`): the same jitted sft / rl / log-prob steps, base and adapters
  sharded by the logical-axis rules."""
  return make_jitted_steps_for(
    lora_training.apply_fn_for(model_config),
    lora_training.param_shardings(model_config, cfg, mesh, rules),
    lora.abstract_params(model_config, cfg, param_dtype),
    tx,
    mesh,
    rules=rules,
    config=config,
  )
