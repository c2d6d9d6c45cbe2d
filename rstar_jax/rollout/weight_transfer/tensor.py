"""Tensor transport (same node): ``POST /update_weights_from_tensor`` with flattened buckets.

SGLang args (``srt/managers/io_struct.py`` UpdateWeightsFromTensorReqInput):
``serialized_named_tensors`` (one payload per TP rank of the server, each
``MultiprocessingSerializer.serialize(obj, output_str=True)``: torch's ``ForkingPickler`` with
its multiprocessing reductions, base64 text), ``load_format`` (None | "direct" |
"flattened_bucket"), ``flush_cache``, ``abort_all_requests``, ``weight_version``. With
"flattened_bucket" the object is ``{"flattened_tensor": uint8 tensor, "metadata": [...]}``
(``buckets.py``). Only handles travel over HTTP:
  * GPU: the JAX array reaches torch through DLPack (no copy), the bucket is filled on the
    device and travels as a CUDA/HIP IPC handle (torch's reductions; ROCm uses the same path);
  * CPU: the bucket lives in shared memory (torch's "file_system" sharing strategy, which an
    unrelated server process can open by name); each tensor is written into it once, kernels
    transposed on the way (``source.write_hf``), by a few threads.
Buckets are reused across pushes; a bucket is refilled only after the server answered for it.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import io
from typing import Any

import numpy as np

from rstar_jax.models import qwen3_hf_layout as layout
from rstar_jax.rollout.weight_transfer import base, buckets, source


def serialize(obj: Any) -> str:
  """SGLang's MultiprocessingSerializer.serialize(obj, output_str=True) semantics."""
  from multiprocessing.reduction import ForkingPickler

  import torch.multiprocessing  # noqa: F401  (registers torch's tensor reductions)

  buf = io.BytesIO()
  ForkingPickler(buf).dump(obj)
  return base64.b64encode(buf.getvalue()).decode()


def deserialize(s: str) -> Any:
  """The receiving side (MultiprocessingSerializer.deserialize of base64 text)."""
  import pickle

  import torch.multiprocessing  # noqa: F401

  return pickle.loads(base64.b64decode(s))


def _on_gpu(params) -> bool:
  import jax

  leaf = jax.tree_util.tree_leaves(params)[0]
  return any(d.platform in ("gpu", "cuda", "rocm") for d in leaf.devices())


@base.register("tensor")
class TensorTransport:
  """bucket_bytes: bytes per flattened bucket (one HTTP call each). tp_size: TP ranks per
  server (the payload is repeated per rank; every rank opens the same handle)."""

  name = "tensor"

  def __init__(self, bucket_bytes: int = 512 << 20, tp_size: int = 1, num_writers: int = 4, **_):
    self.bucket_bytes = int(bucket_bytes)
    self.tp_size = int(tp_size)
    self.num_writers = max(1, int(num_writers))
    self._shm: list = []  # reusable shared-memory buckets (CPU path)

  def _cpu_bucket(self, i: int, n: int):
    import torch
    import torch.multiprocessing as tmp

    tmp.set_sharing_strategy("file_system")
    while len(self._shm) <= i:
      self._shm.append(None)
    if self._shm[i] is None or self._shm[i].numel() < n:
      self._shm[i] = torch.empty(n, dtype=torch.uint8).share_memory_()
    return self._shm[i][:n]

  def _fill_cpu(self, i: int, bucket, arrays: dict, pool) -> Any:
    flat = self._cpu_bucket(i, buckets.bucket_size(bucket))
    source.fill(flat.numpy(), [(e.start,) + arrays[e.name] for e in bucket], pool)
    return flat

  def _fill_gpu(self, bucket, leaves: dict, params):
    import torch

    parts = []
    for e in bucket:
      t = leaves[e.name]
      x = layout.get_leaf(params, t.path)
      x = x[t.layer] if t.layer is not None else x
      if t.transpose:
        x = x.T
      tt = torch.from_dlpack(x)  # no copy: same device buffer
      parts.append(tt.contiguous().reshape(-1).view(torch.uint8))
    return torch.cat(parts)

  async def push(self, engine, config, params, tensors, version: int) -> int:
    if not tensors:
      return 0
    leaf = {t.name: t for t in tensors}
    items = [
      (
        t.name,
        t.shape,
        base.dtype_name(_leaf(params, t)),
        int(np.prod(t.shape)) * np.dtype(_leaf(params, t).dtype).itemsize,
      )
      for t in tensors
    ]
    plan = buckets.plan_buckets(items, self.bucket_bytes)
    gpu = _on_gpu(params)
    arrays: dict[str, tuple] = {}
    gen = None if gpu else source.prefetch(source.host_parts(params, tensors))
    pool = None if gpu else concurrent.futures.ThreadPoolExecutor(self.num_writers)
    try:
      return await self._send(engine, plan, gpu, leaf, params, gen, pool, arrays, version)
    finally:
      if pool is not None:
        pool.shutdown(wait=True)

  async def _send(self, engine, plan, gpu, leaf, params, gen, pool, arrays, version) -> int:
    sent = 0
    for i, bucket in enumerate(plan):
      if gpu:
        flat = self._fill_gpu(bucket, leaf, params)
      else:
        # Pull leaves until this bucket's tensors are on the host (views, no copy).
        while any(e.name not in arrays for e in bucket):
          _, got = await asyncio.to_thread(next, gen)
          arrays.update({t.name: (x, tr) for t, x, tr in got})
        flat = await asyncio.to_thread(self._fill_cpu, i % 2, bucket, arrays, pool)
        for e in bucket:
          arrays.pop(e.name, None)
      payload = serialize({"flattened_tensor": flat, "metadata": buckets.sglang_metadata(bucket)})
      last = i == len(plan) - 1
      body = {
        "serialized_named_tensors": [payload] * self.tp_size,
        "load_format": "flattened_bucket",
        "flush_cache": last,
        "abort_all_requests": False,
      }
      if last:
        body["weight_version"] = str(version)
      replies = await asyncio.gather(
        *[engine._request("POST", u, "/update_weights_from_tensor", body) for u in engine.urls]
      )
      for u, rep in zip(engine.urls, replies):
        if not (isinstance(rep, dict) and rep.get("success")):
          raise base.PushError(
            f"{u}/update_weights_from_tensor (bucket {i + 1}/{len(plan)}): {rep}"
          )
      sent += buckets.bucket_size(bucket)
    return sent

  async def close(self, engine) -> None:
    self._shm.clear()


def _leaf(params, t):
  return layout.get_leaf(params, t.path)
