"""The one table between our Qwen3 param pytree and Hugging Face tensor names / layouts.

Every reader and writer of HF-layout weights uses it: ``qwen3.save_hf``, ``qwen3.load_hf_params``
and every weight transport in ``rstar_jax.rollout.weight_transfer`` (disk, tensor, distributed).

Rules (transformers' ``Qwen3ForCausalLM`` / ``Qwen2ForCausalLM`` state dict, which SGLang loads):
  * stacked layers: our ``layers/...`` leaves carry a leading layer axis [L, ...]; HF has one
    tensor per layer, ``model.layers.{i}.<path>.weight``;
  * transposes: our linear ``kernel`` is [in, out]; ``nn.Linear.weight`` is [out, in];
  * fused projections: none in Qwen3 / Qwen2 checkpoints (q/k/v and gate/up are separate HF
    tensors, as ours), so every HF tensor is exactly one (leaf, layer) pair;
  * tied embeddings: with ``tie_word_embeddings`` we hold no ``lm_head`` and none is written
    (loaders tie ``lm_head.weight`` to ``model.embed_tokens.weight``);
  * Qwen3-MoE (``Qwen3MoeConfig``): ``dense_mlp/...`` row j is layer ``dense_layers[j]``'s
    ``mlp.*``; ``moe/gate`` row j is ``model.layers.{sparse_layers[j]}.mlp.gate.weight`` (the
    router, [E, D]); ``moe/experts/<proj>`` row (j, e) is
    ``model.layers.{sparse_layers[j]}.mlp.experts.{e}.<proj>.weight``, one tensor per expert as
    released checkpoints (and transformers' ``save_pretrained``) store them. Such a tensor's
    ``layer`` is the index tuple ``(j, e)`` into the two leading axes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np

from rstar_jax.models.qwen3_config import Qwen3Config, param_shapes


@dataclasses.dataclass(frozen=True)
class HFTensor:
  """One HF tensor: ``name``; our ``path`` in the param tree; ``layer`` index into the leading
  axis of a stacked leaf (None if not stacked; a tuple ``(layer, expert)`` for MoE experts:
  ``leaf[t.layer]`` is the tensor either way); ``transpose`` (ours is the HF tensor's .T);
  ``shape`` in HF layout."""

  name: str
  path: tuple[str, ...]
  layer: int | tuple[int, ...] | None
  transpose: bool
  shape: tuple[int, ...]


def leaves(tree, prefix=()) -> Iterator[tuple[tuple[str, ...], Any]]:
  """(path, leaf) pairs of a nested dict, in insertion order."""
  for k, v in tree.items():
    if isinstance(v, dict):
      yield from leaves(v, prefix + (k,))
    else:
      yield prefix + (k,), v


def get_leaf(tree, path: tuple[str, ...]):
  for p in path:
    tree = tree[p]
  return tree


def hf_name(path: tuple[str, ...], layer: int | None = None) -> str:
  """Our param path (+ layer index for stacked params) -> HF tensor name."""
  leaf = "bias" if path[-1] == "bias" else "weight"
  if path[0] == "lm_head":
    return f"lm_head.{leaf}"
  if path[0] == "layers":
    return ".".join(("model", "layers", str(layer)) + path[1:-1] + (leaf,))
  return ".".join(("model",) + path[:-1] + (leaf,))


def is_transposed(path: tuple[str, ...]) -> bool:
  return path[-1] == "kernel"


_MOE_STACKS = ("dense_mlp", "moe")  # Qwen3-MoE MLP stacks (rows = a subset of the layers)


def _lead_axes(path: tuple[str, ...]) -> int:
  """Number of leading stacked axes of the leaf at ``path`` (layers, then experts)."""
  if path[0] == "moe" and path[1] == "experts":
    return 2
  return 1 if path[0] in ("layers",) + _MOE_STACKS else 0


def hf_shape(path: tuple[str, ...], shape) -> tuple[int, ...]:
  """HF shape of one tensor of the leaf at ``path`` whose (stacked) shape is ``shape``."""
  shape = tuple(shape[_lead_axes(path) :])
  return shape[::-1] if is_transposed(path) else shape


def _moe_tensors(config, path: tuple[str, ...], shape) -> list[HFTensor]:
  trans, want = is_transposed(path), hf_shape(path, shape)
  if path[0] == "dense_mlp":
    return [
      HFTensor(hf_name(("layers", "mlp") + path[1:], i), path, j, trans, want)
      for j, i in enumerate(config.dense_layers)
    ]
  if path[1] == "gate":
    return [
      HFTensor(f"model.layers.{i}.mlp.gate.weight", path, j, trans, want)
      for j, i in enumerate(config.sparse_layers)
    ]
  proj = path[2]
  return [
    HFTensor(f"model.layers.{i}.mlp.experts.{e}.{proj}.weight", path, (j, e), trans, want)
    for j, i in enumerate(config.sparse_layers)
    for e in range(shape[1])
  ]


def hf_table(config: Qwen3Config) -> list[HFTensor]:
  """Every HF tensor the config needs, in file order (leaf by leaf, layer by layer)."""
  out = []
  for path, shape in leaves(param_shapes(config)):
    trans, want = is_transposed(path), hf_shape(path, shape)
    if path[0] in _MOE_STACKS:
      out += _moe_tensors(config, path, shape)
    elif path[0] == "layers":
      out += [HFTensor(hf_name(path, i), path, i, trans, want) for i in range(shape[0])]
    else:
      out.append(HFTensor(hf_name(path), path, None, trans, want))
  return out


def to_hf(leaf: np.ndarray, t: HFTensor) -> np.ndarray:
  """The HF tensor ``t`` from our (host) leaf: layer slice, then transpose (a view)."""
  x = leaf[t.layer] if t.layer is not None else leaf
  return x.T if t.transpose else x


def from_hf(x: np.ndarray, t: HFTensor) -> np.ndarray:
  """Our layout of one HF tensor (one layer of a stacked leaf): the inverse of ``to_hf``."""
  return x.T if t.transpose else x


def hf_to_tree(tensors: dict[str, np.ndarray], config: Qwen3Config) -> dict[str, Any]:
  """A full set of HF tensors (name -> array) -> our param tree of host arrays."""
  out: dict[str, Any] = {}
  by_leaf: dict[tuple[str, ...], list] = {}
  for t in hf_table(config):
    if t.name not in tensors:
      raise KeyError(f"missing HF tensor {t.name!r} (for {'/'.join(t.path)})")
    by_leaf.setdefault(t.path, []).append(from_hf(np.asarray(tensors[t.name]), t))
  shapes = dict(leaves(param_shapes(config)))
  for path, parts in by_leaf.items():
    node = out
    for p in path[:-1]:
      node = node.setdefault(p, {})
    lead = _lead_axes(path)
    node[path[-1]] = np.stack(parts).reshape(shapes[path]) if lead else parts[0]
  return out
