"""LoRA adapters on the Qwen3 decoder's linear layers, as pure functions over param pytrees.

Why not ``qwix``: qwix adds LoRA by intercepting Flax modules (``nnx.Linear`` / ``nnx.Einsum``
and the ops called inside a module's ``__call__``) and stores the adapters as variables of those
modules. Our model (`rstar_jax.models.qwen3`) is pure functions over a plain nested-dict pytree
(the NNX wrapper is only an edge adapter), so there is no module for qwix to intercept or to
hold the adapters; this file is the small pure equivalent (the low-rank branch is one matmul
pair in ``qwen3._dense``).

Layout. A LoRA policy is a `LoraParams` pytree: ``base`` (the ordinary, frozen param tree, e.g.
bf16) and ``lora`` (the trainable adapters, f32 by default), with the static `LoraConfig`::

    lora = {"layers": {"self_attn": {"q_proj": {"a": [L, in, r], "b": [L, r, out]}, ...},
                       "mlp": {"gate_proj": {...}, ...}}}

For a target kernel W [in, out] the layer computes ``x @ W + (x @ a) @ b * alpha / r``
(PEFT's convention: ``a`` random, ``b`` zero at init, so the adapted model starts equal to the
base). `merge` gives the plain tree with ``W + (alpha / r) a @ b`` (what the samplers, SGLang
pushes and HF exports get); `unmerge` takes the delta off again.

This module is the model side only (shapes, init, merge, the unmerged branch ``qwen3._dense``
evaluates); what training does with the adapters lives in the learner
(`rstar_jax.learner.lora_training`: only ``lora`` is differentiated, the optimizer keeps
moments for the adapters only, checkpoints hold only the adapters plus the base's name) and the
PEFT export beside the HF I/O (`rstar_jax.models.peft_export`). Adapters are laid out by the
same logical-axis rules as the kernels they adapt: ``a`` shares the kernel's input axis, ``b``
its output axis, the rank axis is replicated (`adapter_shardings`).

Dropout (``dropout > 0``): PEFT applies it to the branch's input. The learner step passes no
RNG to the model, so `inject` derives the mask from the micro-batch's token ids and the
optimizer-independent ``seed``: a pure function of the batch (the old-log-prob recompute and
the update of one batch see the same mask; samplers use the merged weights, no dropout).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from rstar_jax.models.qwen3_config import Qwen3Config, param_logical_axes, param_shapes
from rstar_jax.sharding.rules import logical_to_shardings

# Target name -> the sub-tree of a layer holding it.
TARGET_GROUPS = {
  "q_proj": "self_attn",
  "k_proj": "self_attn",
  "v_proj": "self_attn",
  "o_proj": "self_attn",
  "gate_proj": "mlp",
  "up_proj": "mlp",
  "down_proj": "mlp",
}
ALL_TARGETS = tuple(TARGET_GROUPS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraConfig:
  """Static LoRA settings (frozen, hashable: part of the jitted step's static data).

  Attributes:
    rank: r, the adapters' inner width (>= 1).
    alpha: scale numerator; the branch is multiplied by ``alpha / rank``.
    dropout: dropout rate on the branch input during training, in [0, 1).
    targets: which linear layers get adapters (names in ``ALL_TARGETS``).
    dtype: the adapters' dtype (their optimizer moments follow); the base keeps its own.
    base: a pointer to the frozen base (an HF directory or a description), written next to
      the adapters in checkpoints and PEFT exports.
    seed: seed of the dropout masks.
  """

  rank: int
  alpha: float = 16.0
  dropout: float = 0.0
  targets: tuple[str, ...] = ALL_TARGETS
  dtype: str = "float32"
  base: str = ""
  seed: int = 0

  def __post_init__(self):
    object.__setattr__(self, "targets", tuple(self.targets))

    def bad(field, expected):
      raise ValueError(f"LoraConfig.{field}: expected {expected}, got {getattr(self, field)!r}")

    if not isinstance(self.rank, int) or self.rank < 1:
      bad("rank", "an int >= 1")
    if not self.alpha > 0:
      bad("alpha", "> 0")
    if not 0.0 <= self.dropout < 1.0:
      bad("dropout", "a float in [0, 1)")
    unknown = [t for t in self.targets if t not in TARGET_GROUPS]
    if unknown or not self.targets or len(set(self.targets)) != len(self.targets):
      bad("targets", f"distinct names from {list(ALL_TARGETS)}")
    if self.dtype not in ("float32", "bfloat16"):
      bad("dtype", "'float32' or 'bfloat16'")

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


@flax.struct.dataclass
class LoraParams:
  """A LoRA policy: frozen ``base`` tree, trainable ``lora`` adapters, static ``config``."""

  base: Any
  lora: Any
  config: LoraConfig = flax.struct.field(pytree_node=False)


def is_lora(params) -> bool:
  return isinstance(params, LoraParams)


# ----------------------------------------------------------------------------- layout


def _targets(model_config: Qwen3Config, cfg: LoraConfig):
  """[(group, name, (in, out), (in_axis, out_axis))] of the adapted kernels."""
  shapes, axes = param_shapes(model_config)["layers"], param_logical_axes(model_config)["layers"]
  out = []
  for name in cfg.targets:
    g = TARGET_GROUPS[name]
    _, din, dout = shapes[g][name]["kernel"]
    _, ain, aout = axes[g][name]["kernel"]
    out.append((g, name, (din, dout), (ain, aout)))
  return out


def _tree(model_config, cfg, leaf_fn):
  tree: dict[str, Any] = {}
  for g, name, dims, axes in _targets(model_config, cfg):
    tree.setdefault(g, {})[name] = leaf_fn(g, name, dims, axes)
  return {"layers": tree}


def adapter_shapes(model_config: Qwen3Config, cfg: LoraConfig) -> dict[str, Any]:
  """Nested dict of shape tuples of the adapters (``a`` [L, in, r], ``b`` [L, r, out])."""
  L, r = model_config.num_hidden_layers, cfg.rank
  return _tree(model_config, cfg, lambda g, n, d, a: {"a": (L, d[0], r), "b": (L, r, d[1])})


def adapter_logical_axes(model_config: Qwen3Config, cfg: LoraConfig) -> dict[str, Any]:
  """Logical axes of the adapters: ``a`` follows the kernel's input axis, ``b`` its output
  axis (so the branch's matmuls shard like the kernel's); the rank axis is replicated."""
  return _tree(
    model_config,
    cfg,
    lambda g, n, d, a: {"a": ("layers", a[0], None), "b": ("layers", None, a[1])},
  )


def init_adapters(model_config: Qwen3Config, cfg: LoraConfig, key: jax.Array) -> dict[str, Any]:
  """PEFT's init: ``a`` ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming-uniform, a=sqrt(5)), ``b`` = 0."""
  shapes = adapter_shapes(model_config, cfg)
  flat, treedef = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
  keys = jax.random.split(key, len(flat))
  dtype = jnp.dtype(cfg.dtype)
  leaves = []
  for i, shape in enumerate(flat):
    if i % 2 == 0:  # "a" precedes "b" in each {a, b} pair (sorted keys)
      bound = 1.0 / math.sqrt(shape[1])
      leaves.append(jax.random.uniform(keys[i], shape, jnp.float32, -bound, bound).astype(dtype))
    else:
      leaves.append(jnp.zeros(shape, dtype))
  return jax.tree.unflatten(treedef, leaves)


def make_params(base, model_config: Qwen3Config, cfg: LoraConfig, key: jax.Array) -> LoraParams:
  """``base`` (a plain param tree) with freshly initialised adapters."""
  return LoraParams(base=base, lora=init_adapters(model_config, cfg, key), config=cfg)


def adapter_shardings(model_config: Qwen3Config, cfg: LoraConfig, mesh, layout="train"):
  """NamedShardings of the adapters (``a`` [L, in, r], ``b`` [L, r, out]) by the logical-axis
  rules of ``layout``: the same rules as the kernels they adapt (`adapter_logical_axes`)."""
  shapes = jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s, jnp.float32),
    adapter_shapes(model_config, cfg),
    is_leaf=lambda x: isinstance(x, tuple),
  )
  return logical_to_shardings(adapter_logical_axes(model_config, cfg), mesh, layout, shapes)


def abstract_params(model_config: Qwen3Config, cfg: LoraConfig, param_dtype="float32"):
  """`LoraParams` of ShapeDtypeStructs (no allocation)."""

  def sds(dtype):
    return lambda s: jax.ShapeDtypeStruct(s, jnp.dtype(dtype))

  is_shape = lambda x: isinstance(x, tuple)  # noqa: E731
  return LoraParams(
    base=jax.tree.map(sds(param_dtype), param_shapes(model_config), is_leaf=is_shape),
    lora=jax.tree.map(sds(cfg.dtype), adapter_shapes(model_config, cfg), is_leaf=is_shape),
    config=cfg,
  )


# ----------------------------------------------------------------------------- math


def delta(a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
  """``scale * a @ b`` in float32. a: [L, in, r], b: [L, r, out] -> [L, in, out]."""
  return scale * jnp.einsum(
    "lir,lro->lio", a.astype(jnp.float32), b.astype(jnp.float32), precision="highest"
  )


def _map_targets(base, lora, cfg: LoraConfig, fn):
  """Copy of ``base`` (shallow: untouched leaves are shared) with each adapted kernel
  replaced by ``fn(kernel, a, b)``."""
  layers = dict(base["layers"])
  for g, adapters in lora["layers"].items():
    group = dict(layers[g])
    for name, ab in adapters.items():
      p = dict(group[name])
      p["kernel"] = fn(p["kernel"], ab["a"], ab["b"])
      group[name] = p
    layers[g] = group
  return {**base, "layers": layers}


def _add_delta(scale: float):
  return lambda w, a, b: (w.astype(jnp.float32) + delta(a, b, scale)).astype(w.dtype)


def merge(params: LoraParams) -> dict[str, Any]:
  """The plain param tree with every adapted kernel ``W + (alpha/r) a @ b`` (sum in float32,
  stored in W's dtype). Pure, jittable; untouched leaves are the base's own arrays."""
  cfg = params.config
  return _map_targets(params.base, params.lora, cfg, _add_delta(cfg.scale))


def unmerge(merged: dict[str, Any], lora: dict[str, Any], cfg: LoraConfig) -> dict[str, Any]:
  """Inverse of `merge` for the same adapters: ``W' - (alpha/r) a @ b`` (float32)."""
  return _map_targets(
    merged,
    lora,
    cfg,
    lambda w, a, b: (w.astype(jnp.float32) - delta(a, b, cfg.scale)).astype(w.dtype),
  )


# Module-level jits: the config is static pytree data, so one compile per config and shape
# (a jit built per call would recompile on every sampler update / push).
_merge_jit = jax.jit(merge)
_merge_copy_jit = jax.jit(
  lambda p: _map_targets(
    jax.tree.map(jnp.copy, p.base), p.lora, p.config, _add_delta(p.config.scale)
  )
)


def merged(params) -> Any:
  """`merge` for a `LoraParams`, the params unchanged otherwise (the one hook the samplers,
  exports and pushes call)."""
  return _merge_jit(params) if is_lora(params) else params


def merged_copy(params) -> Any:
  """Like `merged`, but every leaf is a fresh array (survives a donating learner step)."""
  if not is_lora(params):
    return jax.tree.map(jnp.copy, params)
  return _merge_copy_jit(params)


def _dropout_key(cfg: LoraConfig, input_ids: jax.Array) -> jax.Array:
  # The step passes no RNG to the model: the mask is a pure function of the batch's tokens
  # (a position-weighted sum of the ids, wrapping in uint32).
  weights = jnp.arange(input_ids.size, dtype=jnp.uint32).reshape(input_ids.shape)
  h = jnp.sum(input_ids.astype(jnp.uint32) * (weights * jnp.uint32(2654435761) + 1))
  return jax.random.fold_in(jax.random.key(cfg.seed), h)


def inject(params: LoraParams, input_ids: jax.Array | None = None) -> dict[str, Any]:
  """The base tree with each adapted dense dict carrying ``lora_a`` (pre-scaled by alpha/r)
  and ``lora_b`` (and, with dropout and ``input_ids``, a per-layer ``lora_key``), the form
  ``qwen3._dense`` evaluates unmerged: ``x @ W + (x @ lora_a) @ lora_b``."""
  cfg = params.config
  layers = dict(params.base["layers"])
  key = None
  if cfg.dropout > 0 and input_ids is not None:
    key = _dropout_key(cfg, input_ids)
  i = 0
  for g, adapters in params.lora["layers"].items():
    group = dict(layers[g])
    for name, ab in adapters.items():
      p = dict(group[name])
      p["lora_a"] = ab["a"] * jnp.asarray(cfg.scale, ab["a"].dtype)
      p["lora_b"] = ab["b"]
      if key is not None:
        L = ab["a"].shape[0]
        p["lora_key"] = jax.random.key_data(jax.random.split(jax.random.fold_in(key, i), L))
        p["lora_keep"] = jnp.full((L,), 1.0 - cfg.dropout, jnp.float32)
      i += 1
      group[name] = p
    layers[g] = group
  return {**params.base, "layers": layers}


def branch(x: jax.Array, p: dict[str, Any]) -> jax.Array:
  """The low-rank branch of one injected dense dict: ``(dropout(x) @ lora_a) @ lora_b``.
  x: [..., in] -> [..., out] in x.dtype."""
  if "lora_key" in p:
    keep = p["lora_keep"]
    mask = jax.random.bernoulli(jax.random.wrap_key_data(p["lora_key"]), keep, x.shape)
    x = jnp.where(mask, x / keep.astype(x.dtype), jnp.zeros_like(x))
  return (x @ p["lora_a"].astype(x.dtype)) @ p["lora_b"].astype(x.dtype)


def adapter_param_count(model_config: Qwen3Config, cfg: LoraConfig) -> int:
  return sum(
    math.prod(s)
    for s in jax.tree.leaves(
      adapter_shapes(model_config, cfg), is_leaf=lambda x: isinstance(x, tuple)
    )
  )
