"""Distributed transport: broadcast from the learner (rank 0) to every SGLang worker.

SGLang args (``srt/managers/io_struct.py``): ``/init_weights_update_group`` {master_address,
master_port, rank_offset, world_size, group_name, backend}; ``/update_weights_from_distributed``
{names, dtypes (e.g. "bfloat16"), shapes, group_name, load_format (None | "flattened_bucket"),
flush_cache, weight_version}; ``/destroy_weights_update_group`` {group_name}. The init and
update calls return only once the collective completed, so the learner issues them and runs its
side (rendezvous, broadcast) in a thread at the same time. Server i's TP ranks are
``rank_offset .. rank_offset + tp_size - 1``. The group is kept across pushes and dropped on
any failure (the next push re-creates it) and on close. Every collective has a bounded timeout
(``timeout_s``; the rendezvous at least 60 s): a dead group member fails the push instead of
hanging it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

import numpy as np

from rstar_jax.models import qwen3_hf_layout as layout
from rstar_jax.rollout.weight_transfer import base, buckets, process_group, source


@base.register("distributed")
class DistributedTransport:
  """master_address: this learner's address as the servers reach it. backend: "gloo" (CPU),
  "nccl" (CUDA and ROCm). bucket_bytes: bytes per broadcast. tp_size: TP ranks per server."""

  name = "distributed"

  def __init__(
    self,
    master_address: str = "127.0.0.1",
    master_port: int | None = None,
    backend: str | None = None,
    bucket_bytes: int = 512 << 20,
    tp_size: int = 1,
    timeout_s: float = 120.0,
    group_name: str = "rstar_jax_weights",
    num_writers: int = 4,
    **_,
  ):
    self.num_writers = max(1, int(num_writers))
    self.master_address = master_address
    self.master_port = master_port
    self.backend = backend
    self.bucket_bytes = int(bucket_bytes)
    self.tp_size = int(tp_size)
    self.timeout_s = float(timeout_s)
    self.group_name = group_name
    self.group: process_group.WeightGroup | None = None
    self._buf = None
    self._inits = 0

  def _backend(self, params) -> str:
    if self.backend:
      return self.backend
    import jax

    leaf = jax.tree_util.tree_leaves(params)[0]
    return "nccl" if any(d.platform != "cpu" for d in leaf.devices()) else "gloo"

  async def _init(self, engine, backend: str) -> None:
    world = 1 + self.tp_size * len(engine.urls)
    port = self.master_port or process_group.free_port()
    self._inits += 1
    name = f"{self.group_name}_{self._inits}"
    join = asyncio.create_task(
      asyncio.to_thread(
        process_group.open_group,
        self.master_address,
        port,
        0,
        world,
        name,
        backend,
        max(self.timeout_s, 60.0),
      )
    )  # rendezvous: servers may be slow to join
    reqs = [
      engine._request(
        "POST",
        u,
        "/init_weights_update_group",
        {
          "master_address": self.master_address,
          "master_port": port,
          "rank_offset": 1 + i * self.tp_size,
          "world_size": world,
          "group_name": name,
          "backend": backend,
        },
        timeout_s=max(self.timeout_s, 60.0) + 10,
      )
      for i, u in enumerate(engine.urls)
    ]
    results = await asyncio.gather(join, *reqs, return_exceptions=True)
    group, replies = results[0], results[1:]
    errs = [
      f"{u}: {r}"
      for u, r in zip(engine.urls, replies)
      if isinstance(r, BaseException) or not (isinstance(r, dict) and r.get("success"))
    ]
    if isinstance(group, BaseException):
      errs.insert(0, f"learner rendezvous: {type(group).__name__}: {group}")
    else:
      self.group = group
    if errs:
      await self.close(engine)
      raise base.PushError("init_weights_update_group failed: " + "; ".join(errs))

  def _fill(self, bucket, arrays, backend, pool):
    import torch

    n = buckets.bucket_size(bucket)
    if self._buf is None or self._buf.numel() < n:
      self._buf = torch.empty(n, dtype=torch.uint8)
    flat = self._buf[:n]
    # Each tensor written once, kernels transposed on the way (source.write_hf).
    source.fill(flat.numpy(), [(e.start,) + arrays[e.name] for e in bucket], pool)
    return flat.cuda() if backend == "nccl" else flat

  async def push(self, engine, config, params, tensors, version: int) -> int:
    if not tensors:
      return 0
    backend = self._backend(params)
    if self.group is None:
      await self._init(engine, backend)

    items = []
    for t in tensors:
      leaf = layout.get_leaf(params, t.path)
      items.append(
        (
          t.name,
          t.shape,
          np.dtype(leaf.dtype).name,
          int(np.prod(t.shape)) * np.dtype(leaf.dtype).itemsize,
        )
      )
    plan = buckets.plan_buckets(items, self.bucket_bytes)
    gen = source.prefetch(source.host_parts(params, tensors))
    pool = concurrent.futures.ThreadPoolExecutor(self.num_writers)
    arrays: dict = {}
    sent = 0
    try:
      for i, bucket in enumerate(plan):
        while any(e.name not in arrays for e in bucket):
          _, got = await asyncio.to_thread(next, gen)
          arrays.update({t.name: (x, tr) for t, x, tr in got})
        flat = await asyncio.to_thread(self._fill, bucket, arrays, backend, pool)
        for e in bucket:
          arrays.pop(e.name, None)
        last = i == len(plan) - 1
        body = {
          "names": [e.name for e in bucket],
          "dtypes": [e.dtype for e in bucket],
          "shapes": [list(e.shape) for e in bucket],
          "group_name": self.group.group_name,
          "load_format": "flattened_bucket",
          "flush_cache": last,
        }
        if last:
          body["weight_version"] = str(version)
        reqs = [
          engine._request(
            "POST", u, "/update_weights_from_distributed", body, timeout_s=self.timeout_s + 10
          )
          for u in engine.urls
        ]
        bcast = asyncio.create_task(asyncio.to_thread(self.group.broadcast, flat, 0))
        results = await asyncio.gather(bcast, *reqs, return_exceptions=True)
        errs = [
          f"{u}: {r}"
          for u, r in zip(engine.urls, results[1:])
          if isinstance(r, BaseException) or not (isinstance(r, dict) and r.get("success"))
        ]
        if isinstance(results[0], BaseException):
          errs.insert(0, f"broadcast: {type(results[0]).__name__}: {results[0]}")
        if errs:
          raise base.PushError(
            f"update_weights_from_distributed (bucket {i + 1}/"
            f"{len(plan)}) failed: " + "; ".join(errs)
          )
        sent += buckets.bucket_size(bucket)
    except BaseException:
      await self.close(engine, notify=False)
      raise
    finally:
      pool.shutdown(wait=True)
    return sent

  async def close(self, engine, notify: bool = True) -> None:
    group, self.group = self.group, None
    if group is None:
      return
    if notify:
      await asyncio.gather(
        *[
          engine._request(
            "POST", u, "/destroy_weights_update_group", {"group_name": group.group_name}
          )
          for u in engine.urls
        ],
        return_exceptions=True,
      )
    group.close()
