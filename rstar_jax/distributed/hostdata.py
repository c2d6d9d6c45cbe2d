"""Host-side data across JAX processes: work split, all-gathers, global arrays, host copies.

The RL step's rollouts are split over processes by prompt: process i of N drives the
contiguous share `local_indices(P)[i]` of the step's P prompts through its own engine client and
code pool, then `allgather_objects` gives every process the same full list of trajectories (and
`allgather_floats` the same rewards), so the penalties, the RoC selection, the advantages and
the batch are computed from identical data on every process and no process decides alone.

All gathers are collectives: every process must call them, in the same order.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import jax
import numpy as np

T = TypeVar("T")


def local_indices(
  n: int, *, process_index: int | None = None, process_count: int | None = None
) -> range:
  """This process's contiguous share of ``range(n)`` (sizes differ by at most one; the first
  ``n % count`` processes get one more)."""
  i = jax.process_index() if process_index is None else process_index
  c = jax.process_count() if process_count is None else process_count
  if not 0 <= i < c:
    raise ValueError(f"local_indices: process_index {i} not in [0, {c})")
  base, extra = divmod(int(n), c)
  start = i * base + min(i, extra)
  return range(start, start + base + (1 if i < extra else 0))


def _allgather_np(x: np.ndarray) -> np.ndarray:
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.process_allgather(x, tiled=False))


def allgather_objects(obj: Any) -> list[Any]:
  """Every process's ``obj`` (any picklable value), in process order; ``[obj]`` with one."""
  if jax.process_count() == 1:
    return [obj]
  blob = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
  sizes = _allgather_np(np.asarray([blob.size], np.int64))[:, 0]
  buf = np.zeros((int(sizes.max()),), np.uint8)
  buf[: blob.size] = blob
  rows = _allgather_np(buf)
  return [pickle.loads(rows[p, : int(sizes[p])].tobytes()) for p in range(len(sizes))]


def allgather_dict(d: Mapping) -> dict:
  """Union of every process's dict (keys must be disjoint: each item made by one process)."""
  out: dict = {}
  for part in allgather_objects(dict(d)):
    dup = out.keys() & part.keys()
    if dup:
      raise RuntimeError(f"allgather_dict: key {sorted(dup)[0]!r} came from two processes")
    out.update(part)
  return out


def sum_over_processes(x: float) -> float:
  """Sum of a host scalar over processes."""
  if jax.process_count() == 1:
    return float(x)
  return float(_allgather_np(np.asarray([x], np.float64)).sum())


async def map_sharded(fn: Callable[[Sequence[T]], Any], items: Sequence[T]) -> list:
  """``await fn(items)`` computed once: each process runs ``fn`` on its contiguous share and the
  results (one per item, in order) are all-gathered. For work that must agree everywhere but
  may not be deterministic per process (e.g. reward verification with a timeout)."""
  share = local_indices(len(items))
  local = list(await fn([items[i] for i in share]))
  if len(local) != len(share):
    raise RuntimeError(f"map_sharded: fn returned {len(local)} results for {len(share)} items")
  out = []
  for part in allgather_objects(local):
    out.extend(part)
  return out


def global_batch(
  batch: Mapping[str, np.ndarray], sharding: Callable[[np.ndarray], Any]
) -> dict[str, jax.Array]:
  """Global arrays from a host batch every process holds in full (identical everywhere after
  the gathers): each process puts only the rows its own devices hold.

  Args:
    batch: name -> numpy array [N, ...].
    sharding: array -> its ``jax.sharding.Sharding`` (e.g. ``JittedSteps.batch_sharding``).
  """
  out = {}
  for k, v in batch.items():
    v = np.asarray(v)
    out[k] = jax.make_array_from_callback(v.shape, sharding(v), lambda idx, v=v: v[idx])
  return out


def global_from_local(local_rows: np.ndarray, sharding, global_rows: int) -> jax.Array:
  """A global [global_rows, ...] array from this process's contiguous rows (data loaders that
  read only their own share), via ``jax.make_array_from_process_local_data``."""
  local_rows = np.asarray(local_rows)
  return jax.make_array_from_process_local_data(
    sharding, local_rows, (int(global_rows),) + local_rows.shape[1:]
  )


def to_host(x) -> np.ndarray:
  """A full numpy copy of ``x`` on this host. Arrays spread over processes are all-gathered
  (a collective: every process calls it); others are copied directly."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def host_params(params: Any) -> Any:
  """A numpy copy of a (sharded, possibly multi-process) params tree, gathered one tensor at a
  time, so at most one full tensor is in flight beyond the copy itself.

  Used for the embedded sampler in a multi-process run: it must hold its own process-local
  weights, since each process samples different prompts at different times and a computation
  over the global mesh would need every process in lockstep.
  """
  return jax.tree.map(to_host, params)


def local_params(params: Any) -> Any:
  """``params`` as they are in one process; the process-local host copy otherwise."""
  if jax.process_count() == 1:
    return params
  return host_params(params)


def gather_lists(*lists: Sequence) -> tuple[list, ...]:
  """Each argument concatenated over processes in process order (the inverse of splitting the
  work with `local_indices`)."""
  if jax.process_count() == 1:
    return tuple(list(x) for x in lists)
  out = tuple([] for _ in lists)
  for part in allgather_objects(tuple(list(x) for x in lists)):
    for acc, x in zip(out, part):
      acc.extend(x)
  return out
