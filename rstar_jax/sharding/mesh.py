"""Device mesh built from a config of axis sizes (``data`` / ``fsdp`` / ``tensor``)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

DEFAULT_AXES: tuple[str, ...] = ("data", "fsdp", "tensor")


def resolve_axis_sizes(sizes: Mapping[str, int], num_devices: int) -> dict[str, int]:
  """Fills the one axis given as -1 with the remaining devices and checks the product.

  Raises:
    ValueError: more than one -1, a size < 1, or a product that is not ``num_devices``.
  """
  sizes = {k: int(v) for k, v in sizes.items()}
  free = [k for k, v in sizes.items() if v == -1]
  if len(free) > 1:
    raise ValueError(f"mesh config: at most one axis may be -1, got {free}")
  bad = {k: v for k, v in sizes.items() if v != -1 and v < 1}
  if bad:
    raise ValueError(f"mesh config: axis sizes must be >= 1 or -1, got {bad}")
  fixed = math.prod(v for v in sizes.values() if v != -1)
  if free:
    if num_devices % fixed:
      raise ValueError(f"mesh config {sizes}: {num_devices} devices not divisible by {fixed}")
    sizes[free[0]] = num_devices // fixed
  if math.prod(sizes.values()) != num_devices:
    raise ValueError(
      f"mesh config {sizes}: product {math.prod(sizes.values())} != {num_devices} devices"
    )
  return sizes


def make_mesh(
  sizes: Mapping[str, int] | None = None,
  devices: Sequence[jax.Device] | None = None,
  axis_names: Sequence[str] = DEFAULT_AXES,
) -> Mesh:
  """Mesh with ``Auto`` axis types (jax 0.10 ``jax.make_mesh`` defaults to Explicit, which
  breaks the embedding gather and other ops the model relies on the partitioner for).

  Args:
    sizes: axis name -> size, one may be -1 ("the rest"); missing names of ``axis_names``
      get size 1. Default: everything on ``fsdp``.  E.g. ``{"fsdp": 4, "tensor": 2}``.
    devices: defaults to ``jax.devices()``.
    axis_names: order of the mesh axes (names in ``sizes`` not listed here are appended).
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = dict(sizes or {"fsdp": -1})
  names = list(axis_names) + [k for k in sizes if k not in axis_names]
  full = resolve_axis_sizes({n: sizes.get(n, 1) for n in names}, len(devices))
  shape = tuple(full[n] for n in names)
  try:
    dev = jax.make_mesh(
      shape, tuple(names), axis_types=(AxisType.Auto,) * len(names), devices=devices
    ).devices
  except Exception:  # topology-aware ordering is best effort; fall back to the given order
    dev = np.asarray(devices).reshape(shape)
  return Mesh(dev, tuple(names), axis_types=(AxisType.Auto,) * len(names))


def use_mesh(mesh: Mesh | None):
  """``jax.set_mesh(mesh)`` as a context, or a no-op for ``None`` (single device)."""
  return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)
