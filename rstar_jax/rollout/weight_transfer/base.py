"""The weight-transport interface, its registry, and what every push reports.

A transport moves one param tree, in the HF layout of ``qwen3_hf_layout``, to every server of
an ``SGLangEngine`` and sets their weight version. The engine wraps it with what all transports
share (``SGLangEngine.update_weights``): memory release/resume when colocated, delta selection,
the ``/get_weight_version`` check, and the stats below.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rstar_jax.models import qwen3_hf_layout as layout
from rstar_jax.models.qwen3_config import param_shapes


class PushError(RuntimeError):
  """A weight push failed part-way; the engine stays on its previous version."""


@dataclasses.dataclass
class PushStats:
  """One push: bytes sent (per server), wall seconds, and the share of HF tensors sent."""

  transport: str
  version: int
  bytes: int = 0
  seconds: float = 0.0
  tensors_sent: int = 0
  tensors_total: int = 0

  @property
  def gbps(self) -> float:
    return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

  @property
  def delta_fraction(self) -> float:
    return self.tensors_sent / self.tensors_total if self.tensors_total else 0.0

  def metrics(self) -> dict[str, float]:
    return {
      "push/bytes": float(self.bytes),
      "push/seconds": self.seconds,
      "push/gbps": self.gbps,
      "push/delta_fraction": self.delta_fraction,
    }


class WeightTransport(Protocol):
  """Sends ``tensors`` (a subset of the config's HF table, in table order) of ``params``.

  ``engine`` is the calling SGLangEngine (its ``urls`` and ``_request``). Returns bytes sent to
  one server. Raises PushError (or SGLangError) on any failure; never leaves background work
  running. ``close`` releases held resources (process groups, shared buffers)."""

  name: str

  async def push(
    self, engine, config, params: Any, tensors: Sequence[layout.HFTensor], version: int
  ) -> int: ...

  async def close(self, engine) -> None: ...


_REGISTRY: dict[str, Callable[..., WeightTransport]] = {}


def register(name: str):
  def deco(factory):
    _REGISTRY[name] = factory
    return factory

  return deco


def transports() -> tuple[str, ...]:
  return tuple(sorted(_REGISTRY))


def make_transport(name: str, **kwargs) -> WeightTransport:
  """The transport registered as ``name`` ("disk" | "tensor" | "distributed")."""
  if name not in _REGISTRY:
    raise ValueError(
      f"rollout.weight_transport: expected one of {list(transports())}, got {name!r}"
    )
  return _REGISTRY[name](**kwargs)


def dtype_name(x: Any) -> str:
  import numpy as np

  return np.dtype(x.dtype).name


def check_params(config, params) -> None:
  """Every leaf the config needs is present with its shape (clear error otherwise)."""

  for path, shape in layout.leaves(param_shapes(config)):
    try:
      leaf = layout.get_leaf(params, path)
    except (KeyError, TypeError):
      raise PushError(f"params lack {'/'.join(path)} required by the config") from None
    if tuple(leaf.shape) != tuple(shape):
      raise PushError(
        f"param {'/'.join(path)} has shape {tuple(leaf.shape)}, expected {tuple(shape)}"
      )
