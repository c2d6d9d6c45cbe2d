"""Weight transfer from the JAX learner to SGLang servers: one interface, three transports.

``make_transport(name, ...)`` with name "disk" | "tensor" | "distributed" (config
``rollout.weight_transport``), optional delta sync (``rollout.weight_delta``). See README.md.
"""

from rstar_jax.rollout.weight_transfer import disk, distributed, tensor  # noqa: F401 (register)
from rstar_jax.rollout.weight_transfer.base import (
  PushError,
  PushStats,
  WeightTransport,
  make_transport,
  register,
  transports,
)

__all__ = ["PushError", "PushStats", "WeightTransport", "make_transport", "register", "transports"]
