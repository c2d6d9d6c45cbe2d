"""Disk transport: staged safetensors in HF layout, then ``POST /update_weights_from_disk``.

Each process writes only the files it owns (file k belongs to process k mod process_count;
process 0 also writes config.json and the index); there are ``num_writers`` files per process
(more when ``max_file_bytes`` caps them), tensors dealt to the emptiest file in table order, so
that the writer threads write different files at once (pwrites into one file serialise on its
inode lock). Everything goes straight from the arrays' host views: the
safetensors header (8-byte little-endian length, JSON, data) is computed from the HF table up
front, each file is sized once, and a thread pool ``os.pwrite``s every tensor at its final
offset: plain tensors straight from the host view (in chunks), kernels after one transpose
(``source.write_hf``) into the writer thread's reused scratch buffer, so one thread's transpose
overlaps another's write. No full-model gather, no per-tensor allocations; bf16 bytes go out
as they are. (Writing through an mmap of the file instead was 2x slower on tmpfs: a page
fault per 4 KiB.) SGLang args (``srt/managers/io_struct.py`` UpdateWeightFromDiskReqInput):
``model_path``, ``load_format``, ``weight_version``, ``flush_cache``, ``abort_all_requests``.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import os
import shutil
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from rstar_jax.models import qwen3_hf_layout as layout
from rstar_jax.rollout.weight_transfer import base, source

INDEX_FILE = "model.safetensors.index.json"
_ST_DTYPE = {"bfloat16": "BF16", "float32": "F32", "float16": "F16", "float64": "F64"}
_CHUNK = 64 << 20  # bytes per pwrite job: big tensors spread over the writer threads


def _header(entries: Sequence[tuple[str, tuple, str, int]]) -> tuple[bytes, list[int]]:
  """safetensors header bytes (8-byte length + JSON padded to 8) and data offsets."""
  meta: dict[str, Any] = {"__metadata__": {"format": "pt"}}
  offs, off = [], 0
  for name, shape, dtype, n in entries:
    meta[name] = {"dtype": _ST_DTYPE[dtype], "shape": list(shape), "data_offsets": [off, off + n]}
    offs.append(off)
    off += n
  js = json.dumps(meta, separators=(",", ":")).encode()
  js += b" " * (-len(js) % 8)
  return len(js).to_bytes(8, "little") + js, offs


def _pwrite_all(fd: int, buf: np.ndarray, offset: int) -> None:
  mv = memoryview(buf)
  while len(mv):
    n = os.pwrite(fd, mv, offset)
    mv, offset = mv[n:], offset + n


_scratch = threading.local()


def _transpose_write(fd: int, x: np.ndarray, offset: int) -> None:
  """x.T's bytes at ``offset``: transposed into this thread's scratch, then written."""
  buf = getattr(_scratch, "buf", None)
  if buf is None or buf.nbytes < x.nbytes:
    buf = _scratch.buf = np.empty(x.nbytes, np.uint8)
  dst = buf[: x.nbytes]
  source.write_hf(dst, x, True)
  _pwrite_all(fd, dst, offset)


def write_hf_dir(
  out_dir: str,
  config,
  params: Any,
  tensors: Sequence[layout.HFTensor],
  *,
  max_file_bytes: int = 4 << 30,
  num_writers: int = 4,
  process_index: int = 0,
  process_count: int = 1,
) -> int:
  """Writes ``tensors`` of ``params`` as an HF dir; returns bytes of tensor data written by
  this process. Every process must call it (non-addressable leaves are all-gathered)."""
  os.makedirs(out_dir, exist_ok=True)
  items = []
  for t in tensors:
    leaf = layout.get_leaf(params, t.path)
    dt = np.dtype(leaf.dtype).name
    if dt not in _ST_DTYPE:
      raise base.PushError(f"{'/'.join(t.path)}: dtype {dt} not writable as safetensors")
    items.append((t, dt, int(np.prod(t.shape)) * np.dtype(leaf.dtype).itemsize))
  # Files: num_writers per process (at least one per process so all of them write), each
  # capped at max_file_bytes. Tensors are dealt to the emptiest file in table order, so the
  # writer threads, which take tensors in that order, write different files at once: pwrites to
  # one file serialise on its inode lock (tmpfs, ext4), and a single staged file left the
  # second core idle.
  total = sum(i[2] for i in items)
  want_files = max(1, process_count) * max(1, num_writers)
  n_files = max(want_files, -(-total // max_file_bytes))
  n_files = max(1, min(n_files, len(items)))
  files: list[list] = [[] for _ in range(n_files)]
  sizes = [0] * n_files
  for it in items:
    k = min(range(n_files), key=lambda f: (sizes[f], f))
    if sizes[k] and sizes[k] + it[2] > max_file_bytes:
      files.append([])
      sizes.append(0)
      k = len(files) - 1
    files[k].append(it)
    sizes[k] += it[2]
  files = [f for f in files if f]
  n = len(files)
  names = [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
  where: dict[str, tuple[int, int]] = {}  # tensor name -> (file, absolute offset)
  fds: dict[int, int] = {}
  written = 0
  try:
    for k, entries in enumerate(files):
      hdr, offs = _header([(t.name, t.shape, dt, nb) for t, dt, nb in entries])
      for (t, _, _), off in zip(entries, offs):
        where[t.name] = (k, len(hdr) + off)
      if k % process_count != process_index:
        continue
      fd = os.open(os.path.join(out_dir, names[k]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
      fds[k] = fd
      os.ftruncate(fd, len(hdr) + sum(nb for _, _, nb in entries))
      _pwrite_all(fd, np.frombuffer(hdr, np.uint8), 0)
    with concurrent.futures.ThreadPoolExecutor(max(1, num_writers)) as pool:
      jobs: list = []
      # Chunks of one big plain tensor (the embedding) all go to one file, where they would
      # queue on its lock with every writer thread waiting: they are handed out one at a
      # time, between the other jobs, so the threads keep writing different files.
      spread: collections.deque = collections.deque()
      for _, parts in source.prefetch(source.host_parts(params, tensors)):
        for t, x, transpose in parts:
          k, off = where[t.name]
          if k not in fds:
            continue
          if transpose:
            jobs.append(pool.submit(_transpose_write, fds[k], x, off))
          else:
            b = x.reshape(-1).view(np.uint8)
            chunks = [(fds[k], b[s : s + _CHUNK], off + s) for s in range(0, b.size, _CHUNK)]
            if len(chunks) > 2:
              spread.extend(chunks)
            else:
              jobs.extend(pool.submit(_pwrite_all, *c) for c in chunks)
          if spread:
            jobs.append(pool.submit(_pwrite_all, *spread.popleft()))
          written += x.nbytes
        # Bound host memory (GPU / all-gathered leaves are host copies): wait for all
        # but the latest jobs.
        if len(jobs) > 64:
          for j in jobs[:-32]:
            j.result()
          jobs = jobs[-32:]
      jobs.extend(pool.submit(_pwrite_all, *c) for c in spread)
      for j in jobs:
        j.result()
  finally:
    for fd in fds.values():
      os.close(fd)
  if process_index == 0:
    wm = {t.name: names[k] for k, entries in enumerate(files) for t, _, _ in entries}
    with open(os.path.join(out_dir, INDEX_FILE), "w") as f:
      json.dump({"metadata": {"total_size": sum(i[2] for i in items)}, "weight_map": wm}, f)
    dts = {dt for _, dt, _ in items}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
      json.dump(config.to_hf_dict("bfloat16" if dts == {"bfloat16"} else "float32"), f, indent=2)
  return written


@base.register("disk")
class DiskTransport:
  """staging_dir: where version dirs go (tmpfs on one node, a shared filesystem across nodes;
  the servers must read it). keep_versions: staged dirs kept. num_writers: pwrite threads."""

  name = "disk"

  def __init__(
    self,
    staging_dir: str | None = None,
    keep_versions: int = 2,
    num_writers: int = 4,
    max_file_bytes: int = 4 << 30,
    **_,
  ):
    self.staging_dir = staging_dir or os.path.join(
      "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp", "rstar_jax_weights"
    )
    self.keep_versions = keep_versions
    self.num_writers = num_writers
    self.max_file_bytes = max_file_bytes
    self.staged: list[str] = []

  async def push(self, engine, config, params, tensors, version: int) -> int:
    import jax

    path = os.path.abspath(os.path.join(self.staging_dir, f"version_{version}"))
    if os.path.exists(path):
      shutil.rmtree(path)
    nbytes = await asyncio.to_thread(
      write_hf_dir,
      path,
      config,
      params,
      tensors,
      max_file_bytes=self.max_file_bytes,
      num_writers=self.num_writers,
      process_index=jax.process_index(),
      process_count=jax.process_count(),
    )
    if jax.process_index() != 0:
      return nbytes  # one process drives the servers
    replies = await asyncio.gather(
      *[
        engine._request(
          "POST",
          u,
          "/update_weights_from_disk",
          {"model_path": path, "weight_version": str(version), "flush_cache": True},
        )
        for u in engine.urls
      ]
    )
    for u, rep in zip(engine.urls, replies):
      if not (isinstance(rep, dict) and rep.get("success")):
        raise base.PushError(f"{u}/update_weights_from_disk({path}): {rep}")
    self.staged.append(path)
    while len(self.staged) > self.keep_versions:
      shutil.rmtree(self.staged.pop(0), ignore_errors=True)
    return nbytes

  async def close(self, engine) -> None:
    return None
