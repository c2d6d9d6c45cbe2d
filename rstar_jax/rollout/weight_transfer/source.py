"""HF-layout tensors straight from the learner's arrays, and the delta selection.

``hf_leaves`` yields, leaf by leaf in table order, each leaf in HF layout on the host: the
transpose of a kernel leaf is one XLA op per stacked leaf ([L, in, out] -> [L, out, in]), run
on the device ``lookahead`` leaves ahead (``prefetch`` runs the whole iterator in a background
thread, so the transposes overlap the caller's writes and sends); the
host copy of a CPU array is a zero-copy view (``np.asarray``), bf16 stays ml_dtypes bf16 (no
float32 round trip), and each layer of a stacked leaf is then a contiguous view. Arrays that are
not fully addressable (multi-host sharding) are all-gathered leaf by leaf (one leaf, never the
whole model, on a host at a time).

``changed_tensors`` compares bit patterns against the params of the last successful push
(kept by reference: the RL loop pushes a copy, so nothing is copied here), on the device, one
reduction per leaf.
"""
from __future__ import annotations

import collections
import functools
from typing import Any, Iterator, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rstar_jax.models import qwen3_hf_layout as layout


@jax.jit
def _to_hf_layout(x):
    return jnp.swapaxes(x, -1, -2) if x.ndim >= 2 else x


def _host(x) -> np.ndarray:
    if not x.is_fully_addressable:
        from jax.experimental import multihost_utils
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)


def hf_leaves(params: Any, tensors: Sequence[layout.HFTensor], lookahead: int = 2
              ) -> Iterator[tuple[tuple[str, ...], list[tuple[layout.HFTensor, np.ndarray]]]]:
    """(leaf path, [(tensor, contiguous host array in HF layout)]) for the leaves ``tensors``
    touch, in order; the arrays stay valid while the caller holds them."""
    groups: "collections.OrderedDict" = collections.OrderedDict()
    for t in tensors:
        groups.setdefault(t.path, []).append(t)
    paths = list(groups)
    pending: "collections.deque" = collections.deque()

    def dispatch(i):
        path = paths[i]
        leaf = layout.get_leaf(params, path)
        if groups[path][0].transpose:
            leaf = _to_hf_layout(leaf)   # [.., in, out] -> [.., out, in], on the device
        pending.append((path, leaf))

    for i in range(min(lookahead, len(paths))):
        dispatch(i)
    for i in range(len(paths)):
        if i + lookahead < len(paths):
            dispatch(i + lookahead)
        path, leaf = pending.popleft()
        host = _host(leaf)
        out = []
        for t in groups[path]:
            x = host[t.layer] if t.layer is not None else host
            out.append((t, np.ascontiguousarray(x)))   # already contiguous: a view
        yield path, out


@functools.partial(jax.jit, static_argnums=2)
def _changed_rows(a, b, stacked: bool):
    # 8-byte types bitcast to uint32 pairs (a trailing axis of 2), folded by the reshape.
    bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[a.dtype.itemsize]
    ne = jax.lax.bitcast_convert_type(a, bits) != jax.lax.bitcast_convert_type(b, bits)
    return ne.reshape(ne.shape[0], -1).any(axis=1) if stacked else ne.any()[None]


def changed_tensors(params: Any, previous: Optional[Any],
                    table: Sequence[layout.HFTensor]) -> list[layout.HFTensor]:
    """The HF tensors whose bytes differ from ``previous`` (all of them if None, if a kept
    array was deleted/donated, or if a dtype/shape changed)."""
    if previous is None:
        return list(table)
    flags: dict[tuple, np.ndarray] = {}
    for t in table:
        if t.path in flags:
            continue
        a, b = layout.get_leaf(params, t.path), layout.get_leaf(previous, t.path)
        if (a.shape != b.shape or a.dtype != b.dtype or
                (hasattr(b, "is_deleted") and b.is_deleted())):
            flags[t.path] = None
        else:
            flags[t.path] = np.asarray(jax.device_get(
                _changed_rows(a, b, t.path[0] == "layers")))
    out = []
    for t in table:
        f = flags[t.path]
        if f is None or bool(f[t.layer if t.layer is not None else 0]):
            out.append(t)
    return out


def prefetch(it, depth: int = 2):
    """Runs iterator ``it`` in a background thread, ``depth`` items ahead (the device transposes
    then overlap the consumer's writes / sends). Exceptions re-raise in the consumer."""
    import queue
    import threading
    q: "queue.Queue" = queue.Queue(maxsize=depth)
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
