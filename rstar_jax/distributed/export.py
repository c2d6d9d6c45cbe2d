"""HF export of params spread over several JAX processes.

Each tensor (each layer's slice of a stacked tensor) is gathered on its own with
``multihost_utils.process_allgather``, in the order `qwen3.save_hf` reads them; process 0
writes it into the current safetensors shard and the other processes drop it at once. So no
host ever holds more than one shard file's worth of tensors (``save_hf``'s
``max_shard_size_bytes``), nobody gathers the whole model, and only process 0 writes files
(the output directory must be on a file system process 0 can write; the others need not see
it). Every process must call `save_hf_multihost` (the gathers are collectives).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from rstar_jax.distributed.hostdata import to_host
from rstar_jax.distributed.primary import sync
from rstar_jax.models import qwen3, qwen3_hf_io


class _GatherOnRead:
  """A params leaf that is all-gathered when read as numpy (``np.asarray(leaf[i])``)."""

  def __init__(self, arr: jax.Array):
    self._arr = arr
    self.shape, self.dtype = arr.shape, arr.dtype

  def __getitem__(self, i):
    return _GatherOnRead(self._arr[i])

  def __array__(self, dtype=None, copy=None):
    x = to_host(self._arr)
    return x if dtype is None else x.astype(dtype)


def save_hf_multihost(
  out_dir: str | os.PathLike, model_config, params: Any, dtype: str | None = None
) -> None:
  """`qwen3.save_hf` (tensors cast to ``dtype``, None = the params') for params sharded over
  processes (module docstring); the plain call with one process."""

  if jax.process_count() == 1:
    qwen3.save_hf(os.fspath(out_dir), model_config, params, dtype=dtype)
    return
  wrapped = jax.tree.map(_GatherOnRead, params)
  if jax.process_index() == 0:
    qwen3.save_hf(os.fspath(out_dir), model_config, wrapped, dtype=dtype)
  else:
    for path, shape in _read_order(model_config):
      leaf = _get(wrapped, path)
      if path[0] == "layers":
        for i in range(shape[0]):
          np.asarray(leaf[i])
      else:
        np.asarray(leaf)

  sync("save_hf_multihost")


def _read_order(model_config):
  """The (path, shape) order in which `qwen3.save_hf` reads tensors (its plan order)."""

  return list(qwen3_hf_io._leaves(qwen3_hf_io.param_shapes(model_config)))


def _get(tree, path):
  for k in path:
    tree = tree[k]
  return tree
