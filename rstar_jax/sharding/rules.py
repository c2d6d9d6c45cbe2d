"""The one table that maps logical array axes to mesh axes, and helpers that apply it.

Model code names each array dimension by what it is ("embed", "mlp", "batch", ...); which mesh
axis (if any) a name is split over is decided only here. Two layouts:

* ``TRAIN_RULES``: FSDP + tensor parallel (+ expert parallel for MoE). Weights are split over
  ``fsdp`` along the model width and over ``tensor`` along heads / MLP / vocab, MoE expert
  stacks over ``expert``, so the optimizer state is spread over every device; the batch is
  split over ``data``, ``fsdp`` and ``expert``.
* ``SAMPLING_RULES``: the same minus FSDP. Decoding reads every weight once per token, so
  gathering FSDP shards per step would dominate; weights are replicated over ``fsdp`` (which
  then acts as one more data-parallel axis for the batch) and only tensor-split.

A mesh axis named in a rule but missing from the mesh, or one that does not divide the
dimension, is dropped for that array, so the same rules serve any mesh (``data=8`` only,
``fsdp=4,tensor=2``, ...) and tiny test models with odd sizes.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

MeshAxes = str | tuple[str, ...] | None
Rules = Mapping[str, MeshAxes]

TRAIN_RULES: dict[str, MeshAxes] = {
  # ---- parameters ----
  "layers": None,  # stacked-layer axis: every device holds its slice of all layers
  "vocab": "tensor",  # embedding / lm_head rows: vocab-parallel logits
  "embed": "fsdp",  # model width of weights: the FSDP shard dimension
  "q_heads": "tensor",  # flattened (num_heads * head_dim) of q / o projections
  "kv_heads": "tensor",  # flattened (num_kv_heads * head_dim) of k / v projections
  "mlp": "tensor",  # SwiGLU hidden width
  "norm": None,  # RMSNorm scales are tiny: replicate
  "head_dim": None,  # q/k-norm scales over head_dim: replicate
  "expert": "expert",  # MoE expert stacks: expert parallel (tokens exchanged by all-to-all)
  "expert_mlp": "tensor",  # one expert's SwiGLU hidden width
  # ---- activations ----
  # rows: data parallel over the batch-like axes (the expert axis is one: expert parallelism
  # splits the tokens over it too and exchanges them inside the MoE layer)
  "batch": ("data", "fsdp", "expert"),
  "seq": None,  # no sequence parallelism
  "act_embed": None,  # residual stream width stays whole on each device
  "act_heads": "tensor",  # attention heads follow the tensor-split projections
  "act_mlp": "tensor",
  "act_vocab": "tensor",
  "cache_seq": None,
}

SAMPLING_RULES: dict[str, MeshAxes] = {**TRAIN_RULES, "embed": None}

LAYOUTS: dict[str, Rules] = {"train": TRAIN_RULES, "sampling": SAMPLING_RULES}


def get_rules(layout: str | Rules) -> Rules:
  """``"train"`` / ``"sampling"`` -> rules table; a mapping is returned unchanged."""
  if isinstance(layout, str):
    if layout not in LAYOUTS:
      raise ValueError(f"unknown sharding layout {layout!r}; expected one of {sorted(LAYOUTS)}")
    return LAYOUTS[layout]
  return layout


def _axis_sizes(mesh) -> dict[str, int]:
  return (
    dict(zip(mesh.axis_names, mesh.axis_sizes)) if hasattr(mesh, "axis_sizes") else dict(mesh.shape)
  )


def logical_to_spec(
  logical_axes: Sequence[str | None], rules: Rules, mesh=None, shape: Sequence[int] | None = None
) -> P:
  """Logical axis names -> PartitionSpec.

  With ``mesh`` given, mesh axes that the mesh lacks (or of size 1) are dropped; with
  ``shape`` also given, axes whose product does not divide the dimension are dropped
  (right to left) so the spec is always valid for that array. A mesh axis is used at most
  once per array.
  """
  sizes = _axis_sizes(mesh) if mesh is not None else None
  used: set[str] = set()
  out = []
  for i, name in enumerate(logical_axes):
    if name is None:
      out.append(None)
      continue
    if name not in rules:
      raise KeyError(f"logical axis {name!r} has no entry in the sharding rules")
    target = rules[name]
    axes = [] if target is None else ([target] if isinstance(target, str) else list(target))
    axes = [a for a in axes if a not in used]
    if sizes is not None:
      axes = [a for a in axes if sizes.get(a, 1) > 1]
      if shape is not None:
        while axes and shape[i] % math.prod(sizes[a] for a in axes):
          axes.pop()
    used.update(axes)
    out.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
  return P(*out)


def _is_axes(x) -> bool:
  return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def logical_to_shardings(
  logical_tree: Any, mesh: jax.sharding.Mesh, layout: str | Rules = "train", shapes: Any = None
) -> Any:
  """Pytree of logical-axes tuples -> same pytree of ``NamedSharding``.

  Args:
    logical_tree: e.g. ``qwen3.param_logical_axes(config)``.
    mesh: the concrete mesh.
    layout: ``"train"``, ``"sampling"`` or a rules mapping.
    shapes: optional matching pytree of arrays / ShapeDtypeStructs; enables the
      divisibility check (recommended: tiny test models have odd sizes).
  """
  rules = get_rules(layout)
  if shapes is None:
    return jax.tree.map(
      lambda ax: NamedSharding(mesh, logical_to_spec(ax, rules, mesh)),
      logical_tree,
      is_leaf=_is_axes,
    )
  return jax.tree.map(
    lambda ax, s: NamedSharding(mesh, logical_to_spec(ax, rules, mesh, tuple(s.shape))),
    logical_tree,
    shapes,
    is_leaf=_is_axes,
  )


_ACTIVATION_RULES: contextvars.ContextVar[Rules] = contextvars.ContextVar(
  "rstar_jax_activation_rules", default=TRAIN_RULES
)


@contextlib.contextmanager
def activation_layout(layout: str | Rules):
  """Selects the rules ``constrain`` uses while tracing (default: the train layout)."""
  token = _ACTIVATION_RULES.set(get_rules(layout))
  try:
    yield
  finally:
    _ACTIVATION_RULES.reset(token)


def active_rules() -> Rules:
  """The rules ``constrain`` uses now (see `activation_layout`)."""
  return _ACTIVATION_RULES.get()


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
  """``with_sharding_constraint`` by logical names, only when a mesh is active.

  Active means traced under ``jax.set_mesh(mesh)`` (see ``mesh.use_mesh``). Without one
  (single CPU, plain ``jax.jit``) this is the identity, so model code runs anywhere.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty:
    return x
  spec = logical_to_spec(logical_axes, _ACTIVATION_RULES.get(), mesh, x.shape)
  return jax.lax.with_sharding_constraint(x, spec)
