"""Hugging Face safetensors checkpoints <-> the Qwen3/Qwen2 param pytree.

Loading streams: each param is built with ``jax.make_array_from_callback`` and every device
shard is read from the safetensors file as just that slice (``safe_open(...).get_slice``), so
neither the whole model nor a whole tensor of a sharded param sits in one host buffer.
Saving writes one tensor at a time into size-capped shard files plus an index, the layout
``transformers.AutoModelForCausalLM.from_pretrained`` (and SGLang) read.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from rstar_jax.models import qwen3_hf_layout as hf_layout
from rstar_jax.models.qwen3_config import Qwen3Config, param_logical_axes, param_shapes
from rstar_jax.sharding.rules import logical_to_shardings

INDEX_FILE = "model.safetensors.index.json"
SAVE_DTYPES = ("float32", "bfloat16", "float16")  # what `save_hf` writes (transformers' names)
SINGLE_FILE = "model.safetensors"


class CheckpointError(ValueError):
  """An HF checkpoint does not match the config (missing tensor, wrong shape, ...)."""


# ----------------------------------------------------------------------------- name mapping
# The mapping lives in one table (qwen3_hf_layout), shared with the weight transports.
_leaves = hf_layout.leaves
_hf_name = hf_layout.hf_name
_transposed = hf_layout.is_transposed
_hf_shape = hf_layout.hf_shape
_get = hf_layout.get_leaf


def hf_names(config: Qwen3Config) -> list[str]:
  """All HF tensor names the config needs, in file order."""
  return [t.name for t in hf_layout.hf_table(config)]


# ----------------------------------------------------------------------------- load


def _weight_map(hf_dir: str) -> dict[str, str]:
  """HF tensor name -> absolute safetensors file path."""
  index = os.path.join(hf_dir, INDEX_FILE)
  if os.path.isfile(index):
    with open(index) as f:
      wm = json.load(f).get("weight_map")
    if not isinstance(wm, dict):
      raise CheckpointError(f"{index}: no 'weight_map' object")
    files = {fn: os.path.join(hf_dir, fn) for fn in set(wm.values())}
    for fn, p in sorted(files.items()):
      if not os.path.isfile(p):
        raise FileNotFoundError(f"missing safetensors file {p} (listed in {index})")
    return {name: files[fn] for name, fn in wm.items()}
  paths = sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")))
  if not paths:
    raise FileNotFoundError(f"no *.safetensors files (and no {INDEX_FILE}) in {hf_dir}")
  wm = {}
  for p in paths:
    with safe_open(p, framework="np") as f:
      wm.update({k: p for k in f.keys()})
  return wm


def load_hf_params(
  hf_dir: str | os.PathLike,
  config: Qwen3Config | None = None,
  mesh=None,
  dtype=jnp.float32,
  layout: str = "train",
) -> dict[str, Any]:
  """Reads an HF Qwen3/Qwen2/Qwen3-MoE checkpoint into the param pytree.

  Args:
    hf_dir: directory with config.json and *.safetensors (one file or an index + shards).
    config: defaults to ``Qwen3Config.from_hf(hf_dir)``.
    mesh: if given, each param is created directly with its ``NamedSharding`` from the
      sharding rules (``layout``: "train" or "sampling"); else on the default device.
    dtype: param dtype (checkpoint values are cast slice by slice).
  Raises:
    FileNotFoundError: config.json or safetensors files missing.
    CheckpointError: a tensor the config needs is absent, or has the wrong shape.
  """
  hf_dir = os.fspath(hf_dir)
  if config is None:
    config = Qwen3Config.from_hf(hf_dir)
  elif not os.path.isfile(os.path.join(hf_dir, "config.json")):
    raise FileNotFoundError(f"missing HF config file: {os.path.join(hf_dir, 'config.json')}")
  wm = _weight_map(hf_dir)
  shapes = param_shapes(config)
  if mesh is not None:
    abstract = jax.tree.map(
      lambda s: jax.ShapeDtypeStruct(s, dtype), shapes, is_leaf=lambda x: isinstance(x, tuple)
    )
    shardings = logical_to_shardings(param_logical_axes(config), mesh, layout, abstract)
  else:
    shardings = None
  dtype = np.dtype(dtype)

  with contextlib.ExitStack() as stack:
    handles: dict[str, Any] = {}

    def tensor_slice(name: str):
      path = wm[name]
      if path not in handles:
        handles[path] = stack.enter_context(safe_open(path, framework="np"))
      return handles[path].get_slice(name)

    # Validate every name and shape before reading any data.
    for t in hf_layout.hf_table(config):
      if t.name not in wm:
        raise CheckpointError(
          f"{hf_dir}: missing tensor {t.name!r} (needed for {'/'.join(t.path)})"
        )
      got = tuple(tensor_slice(t.name).get_shape())
      if got != t.shape:
        raise CheckpointError(
          f"{hf_dir}: tensor {t.name!r} has shape {got}, expected {t.shape} for this config"
        )

    # Per leaf: the HF tensor names on a grid over its leading (layer[, expert]) axes.
    grids: dict[tuple[str, ...], list] = {}
    for t in hf_layout.hf_table(config):
      grids.setdefault(t.path, []).append(t)
    out: dict[str, Any] = {}
    for path, shape in _leaves(shapes):
      trans, tensors = _transposed(path), grids[path]
      first = tensors[0].layer
      lead = 0 if first is None else len(first) if isinstance(first, tuple) else 1
      names = np.empty(len(tensors), object)
      names[:] = [t.name for t in tensors]
      names = names.reshape(tuple(shape[:lead]))

      def read(index, shape=shape, trans=trans, names=names, lead=lead):
        index = tuple(index) + (slice(None),) * (len(shape) - len(index))
        inner = index[lead:]
        inner = inner[::-1] if trans else inner
        picked = names[index[:lead]] if lead else names
        parts = []
        for name in np.ravel(picked):
          x = tensor_slice(name)[inner]
          parts.append(np.asarray(x.T if trans else x, dtype=dtype))
        if not lead:
          return parts[0]
        return np.stack(parts).reshape(np.shape(picked) + parts[0].shape)

      sharding = (
        _get(shardings, path)
        if shardings is not None
        else jax.sharding.SingleDeviceSharding(jax.devices()[0])
      )
      arr = jax.make_array_from_callback(tuple(shape), sharding, read)
      node = out
      for p in path[:-1]:
        node = node.setdefault(p, {})
      node[path[-1]] = arr
  return out


# ----------------------------------------------------------------------------- save


def save_hf(
  out_dir: str | os.PathLike,
  config: Qwen3Config,
  params: dict[str, Any],
  max_shard_size_bytes: int = 5 * 2**30,
  dtype: str | None = None,
) -> None:
  """Writes an HF directory: config.json, generation-free safetensors shard(s), index.

  Tensors keep the params' dtype (float32, bfloat16 or float16), or are cast to ``dtype``
  (one of `SAVE_DTYPES`) one at a time on the host, so a bf16 export of f32 params never
  holds a second copy of the model. A single ``model.safetensors`` is written when everything
  fits in ``max_shard_size_bytes``; otherwise ``model-0000i-of-0000n.safetensors`` +
  ``model.safetensors.index.json``. One shard's worth of tensors is held on the host at a time.
  """
  if dtype is not None and dtype not in SAVE_DTYPES:
    raise ValueError(f"save_hf: dtype must be one of {SAVE_DTYPES}, got {dtype!r}")
  out_dir = os.fspath(out_dir)
  os.makedirs(out_dir, exist_ok=True)
  shapes = param_shapes(config)
  dtypes = set()
  plan: list[tuple[hf_layout.HFTensor, int]] = []  # tensor, bytes
  for path, shape in _leaves(shapes):
    try:
      arr = _get(params, path)
    except KeyError:
      raise CheckpointError(f"params lack {'/'.join(path)} required by the config") from None
    if tuple(arr.shape) != tuple(shape):
      raise CheckpointError(
        f"param {'/'.join(path)} has shape {tuple(arr.shape)}, expected {tuple(shape)}"
      )
    dtypes.add(jnp.dtype(arr.dtype).name)
  for t in hf_layout.hf_table(config):
    item = jnp.dtype(dtype or _get(params, t.path).dtype).itemsize
    plan.append((t, int(np.prod(t.shape)) * item))
  # Group in order into shards under the cap (a tensor bigger than the cap gets its own).
  shards: list[list] = [[]]
  size = 0
  for entry in plan:
    if shards[-1] and size + entry[1] > max_shard_size_bytes:
      shards.append([])
      size = 0
    shards[-1].append(entry)
    size += entry[1]
  n = len(shards)
  weight_map = {}
  for s, entries in enumerate(shards):
    fname = SINGLE_FILE if n == 1 else f"model-{s + 1:05d}-of-{n:05d}.safetensors"
    tensors = {}
    for t, _ in entries:
      arr = _get(params, t.path)
      x = np.asarray(jax.device_get(arr[t.layer] if t.layer is not None else arr))
      if dtype is not None:
        x = x.astype(jnp.dtype(dtype))
      tensors[t.name] = np.ascontiguousarray(x.T if t.transpose else x)
      weight_map[t.name] = fname
    save_file(tensors, os.path.join(out_dir, fname), metadata={"format": "pt"})
    del tensors
  if n > 1:
    with open(os.path.join(out_dir, INDEX_FILE), "w") as f:
      json.dump(
        {"metadata": {"total_size": sum(e[1] for e in plan)}, "weight_map": weight_map}, f, indent=2
      )
  else:
    stale = os.path.join(out_dir, INDEX_FILE)
    if os.path.exists(stale):
      os.remove(stale)
  dtype_name = dtype or (
    dtypes.pop() if len(dtypes) == 1 and dtypes <= {"bfloat16", "float16"} else "float32"
  )
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(config.to_hf_dict(dtype_name), f, indent=2)
