"""HF-layout tensors straight from the learner's arrays, and the delta selection.

``host_parts`` yields, leaf by leaf in table order, each HF tensor's source on the host plus
whether it still needs its transpose: on CPU the host array is a zero-copy view of the JAX
buffer (``np.asarray``) and the transpose is left to ``write_hf``, which writes the HF bytes
straight into the caller's destination (a file mmap, a shared-memory bucket) -- one pass over
the bytes, no intermediate array. XLA:CPU's bf16 transposes run at ~0.2 GB/s, NumPy's strided
copy of a transposed 2-byte view at ~0.3 GB/s; torch's blocked 2-D transpose copy
(``copy_`` of a ``.t()`` view, used when torch is installed) runs near memcpy speed, and releases
the GIL so several tensors transpose in parallel. On GPUs the kernel leaves are transposed on
the device (one XLA op per stacked leaf, ``lookahead`` leaves ahead) and copied to the host
already in HF layout. bf16 stays bf16 bit patterns throughout (no float32 round trip). Arrays
that are not fully addressable (multi-host sharding) are all-gathered leaf by leaf (one leaf,
never the whole model, on a host at a time).

``changed_tensors`` compares bit patterns against the params of the last successful push
(kept by reference: the RL loop pushes a copy, so nothing is copied here), one compare per
layer: on CPU over zero-copy host views as 8-byte words, elsewhere one device reduction per leaf.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rstar_jax.models import qwen3_hf_layout as layout
from rstar_jax.rollout.weight_transfer.buckets import as_bytes


@jax.jit
def _to_hf_layout(x):
  return jnp.swapaxes(x, -1, -2) if x.ndim >= 2 else x


def _host(x) -> np.ndarray:
  if not x.is_fully_addressable:
    from jax.experimental import multihost_utils

    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(x)


def _on_cpu(x) -> bool:
  return all(d.platform == "cpu" for d in x.devices())


def host_parts(
  params: Any, tensors: Sequence[layout.HFTensor], lookahead: int = 2
) -> Iterator[tuple[tuple[str, ...], list[tuple[layout.HFTensor, np.ndarray, bool]]]]:
  """(leaf path, [(tensor, contiguous host array, transpose)]) for the leaves ``tensors``
  touch, in order. ``write_hf(dst, array, transpose)`` writes the tensor's HF bytes; with
  transpose False the array already is the HF tensor. Arrays stay valid while held."""
  groups: collections.OrderedDict = collections.OrderedDict()
  for t in tensors:
    groups.setdefault(t.path, []).append(t)
  paths = list(groups)
  pending: collections.deque = collections.deque()

  def dispatch(i):
    path = paths[i]
    leaf = layout.get_leaf(params, path)
    on_host = _on_cpu(leaf)
    if groups[path][0].transpose and not on_host:
      leaf = _to_hf_layout(leaf)  # [.., in, out] -> [.., out, in], on the device
    pending.append((path, leaf, on_host))

  for i in range(min(lookahead, len(paths))):
    dispatch(i)
  for i in range(len(paths)):
    if i + lookahead < len(paths):
      dispatch(i + lookahead)
    path, leaf, on_host = pending.popleft()
    host = _host(leaf)
    out = []
    for t in groups[path]:
      x = host[t.layer] if t.layer is not None else host
      out.append((t, np.ascontiguousarray(x), t.transpose and on_host and x.ndim == 2))
    yield path, out


def hf_leaves(
  params: Any, tensors: Sequence[layout.HFTensor], lookahead: int = 2
) -> Iterator[tuple[tuple[str, ...], list[tuple[layout.HFTensor, np.ndarray]]]]:
  """(leaf path, [(tensor, contiguous host array in HF layout)]): ``host_parts`` with the
  transposes materialised (one new array per transposed tensor)."""
  for path, parts in host_parts(params, tensors, lookahead):
    out = []
    for t, x, tr in parts:
      if tr:
        y = np.empty(x.shape[::-1], x.dtype)
        write_hf(as_bytes(y), x, True)
        x = y
      out.append((t, x))
    yield path, out


_INT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_TILE = 256


def _torch():
  try:
    import torch

    return torch
  except ImportError:  # optional dependency: NumPy tiles then
    return None


def write_hf(dst: np.ndarray, x: np.ndarray, transpose: bool) -> None:
  """Writes the HF bytes of ``x`` (``x.T`` if ``transpose``; x 2-D then) into ``dst``, a
  contiguous uint8 array of ``x.nbytes``. One pass; bit patterns copied as same-size ints."""
  if dst.nbytes != x.nbytes:
    raise ValueError(f"write_hf: destination has {dst.nbytes} bytes, tensor {x.nbytes}")
  if not transpose:
    np.copyto(dst, as_bytes(x))
    return
  if x.ndim != 2:
    raise ValueError(f"write_hf: transpose needs a 2-D array, got shape {x.shape}")
  src = np.ascontiguousarray(x).view(_INT[x.dtype.itemsize])
  out = dst.view(src.dtype).reshape(src.shape[::-1])
  torch = _torch()
  if torch is not None:
    # DLPack (not from_numpy): the source view may be read-only (a JAX buffer).
    torch.from_dlpack(out).copy_(torch.from_dlpack(src).t())
    return
  n, m = src.shape
  for i in range(0, m, _TILE):
    for j in range(0, n, _TILE):
      np.copyto(out[i : i + _TILE, j : j + _TILE], src[j : j + _TILE, i : i + _TILE].T)


def fill(
  dst: np.ndarray, jobs: Sequence[tuple[int, np.ndarray, bool]], pool=None, chunk: int = 64 << 20
) -> None:
  """Writes (offset, host array, transpose) jobs into the uint8 buffer ``dst`` with
  ``write_hf``, on ``pool`` (a ThreadPoolExecutor) when given; plain copies larger than
  ``chunk`` bytes are split so they spread over the threads."""
  work = []
  for off, x, tr in jobs:
    if tr:
      work.append((dst[off : off + x.nbytes], x, True))
      continue
    b = as_bytes(x)
    for s in range(0, b.size, chunk):
      work.append((dst[off + s : off + min(s + chunk, b.size)], b[s : s + chunk], False))
  if pool is None:
    for w in work:
      write_hf(*w)
    return
  for f in [pool.submit(write_hf, *w) for w in work]:
    f.result()


@functools.partial(jax.jit, static_argnums=2)
def _changed_rows(a, b, lead: int):
  # 8-byte types bitcast to uint32 pairs (a trailing axis of 2), folded by the reshape.
  bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[a.dtype.itemsize]
  ne = jax.lax.bitcast_convert_type(a, bits) != jax.lax.bitcast_convert_type(b, bits)
  return ne.reshape(*a.shape[:lead], -1).any(axis=-1)


def _changed_rows_host(a: np.ndarray, b: np.ndarray, lead: int) -> np.ndarray:
  """_changed_rows on zero-copy host views, compared as the widest unsigned ints that divide
  each row (8x fewer elements than bytes; XLA:CPU's per-leaf compare ran at ~0.3 GB/s)."""
  dims = a.shape[:lead]
  rows = int(np.prod(dims))
  a, b = a.reshape(rows, -1).view(np.uint8), b.reshape(rows, -1).view(np.uint8)
  w = next(k for k in (8, 4, 2, 1) if a.shape[1] % k == 0)
  u = {8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}[w]
  a, b = a.view(u), b.view(u)
  return np.array([not np.array_equal(a[i], b[i]) for i in range(rows)]).reshape(dims)


def changed_tensors(
  params: Any, previous: Any | None, table: Sequence[layout.HFTensor]
) -> list[layout.HFTensor]:
  """The HF tensors whose bytes differ from ``previous`` (all of them if None, if a kept
  array was deleted/donated, or if a dtype/shape changed). One flag per HF tensor: per layer
  of a stacked leaf, per (layer, expert) of a Qwen3-MoE expert stack."""
  if previous is None:
    return list(table)
  flags: dict[tuple, np.ndarray] = {}
  for t in table:
    if t.path in flags:
      continue
    a, b = layout.get_leaf(params, t.path), layout.get_leaf(previous, t.path)
    lead = 0 if t.layer is None else len(t.layer) if isinstance(t.layer, tuple) else 1
    if a.shape != b.shape or a.dtype != b.dtype or (hasattr(b, "is_deleted") and b.is_deleted()):
      flags[t.path] = None
    elif _on_cpu(a) and _on_cpu(b) and a.is_fully_addressable and b.is_fully_addressable:
      flags[t.path] = _changed_rows_host(np.asarray(a), np.asarray(b), lead)
    else:
      flags[t.path] = np.asarray(jax.device_get(_changed_rows(a, b, lead)))
  out = []
  for t in table:
    f = flags[t.path]
    if f is None or bool(f[t.layer] if t.layer is not None else f):
      out.append(t)
  return out


def prefetch(it, depth: int = 2):
  """Runs iterator ``it`` in a background thread, ``depth`` items ahead (the device transposes
  then overlap the consumer's writes / sends). Exceptions re-raise in the consumer."""
  import queue
  import threading

  q: queue.Queue = queue.Queue(maxsize=depth)
  stop = threading.Event()
  end = object()

  def run():
    try:
      for item in it:
        while not stop.is_set():
          try:
            q.put(item, timeout=0.1)
            break
          except queue.Full:
            continue
        if stop.is_set():
          return
      q.put(end)
    except BaseException as e:  # noqa: BLE001 - handed to the consumer
      q.put(e)

  th = threading.Thread(target=run, daemon=True, name="hf-leaves")
  th.start()
  try:
    while True:
      item = q.get()
      if item is end:
        return
      if isinstance(item, BaseException):
        raise item
      yield item
  finally:
    stop.set()
