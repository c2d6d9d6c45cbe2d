"""Flattened buckets in SGLang's ``flattened_bucket`` format.

SGLang (``srt/weight_sync/tensor_bucket.py``, current releases) reads a bucket as one uint8
tensor plus per-tensor metadata (``name``, ``shape``, ``dtype``, ``start_idx``, ``end_idx``,
``numel``; indices and numel in bytes), and rebuilds each tensor as
``flat[start_idx:end_idx].view(dtype).reshape(shape)``; several dtypes may share a bucket.
The update-from-distributed path builds the same byte concatenation from ``names``/``dtypes``/
``shapes`` in request order and receives one broadcast into it.

Metadata entries travel as ``types.SimpleNamespace`` objects: SGLang only reads their attributes,
and the class unpickles on a server that cannot import rstar_jax.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class BucketEntry:
  name: str
  shape: tuple[int, ...]
  dtype: str  # numpy / torch name without prefix: "bfloat16", "float32"
  start: int  # byte offsets in the bucket
  end: int


def plan_buckets(
  items: Sequence[tuple[str, tuple[int, ...], str, int]], bucket_bytes: int
) -> list[list[BucketEntry]]:
  """Greedy, in order: (name, shape, dtype, nbytes) -> buckets of at most ``bucket_bytes``
  (a tensor larger than that gets a bucket of its own)."""
  if bucket_bytes < 1:
    raise ValueError(f"bucket_bytes: expected >= 1, got {bucket_bytes}")
  out: list[list[BucketEntry]] = []
  cur: list[BucketEntry] = []
  off = 0
  for name, shape, dtype, n in items:
    if cur and off + n > bucket_bytes:
      out.append(cur)
      cur, off = [], 0
    cur.append(BucketEntry(name, tuple(int(s) for s in shape), dtype, off, off + n))
    off += n
  if cur:
    out.append(cur)
  return out


def bucket_size(bucket: Sequence[BucketEntry]) -> int:
  return bucket[-1].end if bucket else 0


def torch_dtype(name: str):
  import torch

  dt = getattr(torch, name, None)
  if not isinstance(dt, torch.dtype):
    raise ValueError(f"unknown dtype name {name!r}")
  return dt


def sglang_metadata(bucket: Sequence[BucketEntry]) -> list:
  """SGLang's FlattenedTensorMetadata fields for each entry (as SimpleNamespace)."""
  import torch

  return [
    types.SimpleNamespace(
      name=e.name,
      shape=torch.Size(e.shape),
      dtype=torch_dtype(e.dtype),
      start_idx=e.start,
      end_idx=e.end,
      numel=e.end - e.start,
    )
    for e in bucket
  ]


def reconstruct(flat, metadata) -> list:
  """(name, tensor) views of a received uint8 bucket (what SGLang's loader does)."""
  return [(m.name, flat[m.start_idx : m.end_idx].view(m.dtype).reshape(m.shape)) for m in metadata]


def as_bytes(x: np.ndarray) -> np.ndarray:
  """Flat uint8 view of a contiguous host array (bf16 included; no copy)."""
  return np.ascontiguousarray(x).reshape(-1).view(np.uint8)
