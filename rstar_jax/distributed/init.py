"""``jax.distributed.initialize`` from environment variables, for several JAX processes.

Variables (set by `scripts/local_cluster.sh`; a cluster launcher may set the same ones):
  RSTAR_COORDINATOR       host:port of process 0's coordinator service.
  RSTAR_NUM_PROCESSES     number of processes N.
  RSTAR_PROCESS_ID        this process's index in [0, N).
  RSTAR_HEARTBEAT_S       optional: seconds without a heartbeat before the coordinator declares a
                          process lost and the survivors fail (JAX's default is 100 s).
  RSTAR_INIT_TIMEOUT_S    optional: seconds to wait for every process to join (default 300).

On CPU the cross-process collectives use gloo (``jax_cpu_collectives_implementation``); this
must be set before the first computation, so call `initialize_from_env` first thing in a
launcher's ``main``.
"""

from __future__ import annotations

import logging
import os

import jax

log = logging.getLogger(__name__)

ENV_COORDINATOR = "RSTAR_COORDINATOR"
ENV_NUM_PROCESSES = "RSTAR_NUM_PROCESSES"
ENV_PROCESS_ID = "RSTAR_PROCESS_ID"
ENV_HEARTBEAT = "RSTAR_HEARTBEAT_S"
ENV_INIT_TIMEOUT = "RSTAR_INIT_TIMEOUT_S"


def _int_env(name: str, default: int | None = None) -> int | None:
  v = os.environ.get(name)
  if v is None or v == "":
    return default
  try:
    return int(v)
  except ValueError:
    raise ValueError(f"{name}: expected an integer, got {v!r}") from None


def initialize_from_env() -> bool:
  """Initialises multi-process JAX when ``RSTAR_NUM_PROCESSES`` > 1; returns whether it did.

  Raises ValueError with the variable's name when the variables are incomplete or malformed.
  """
  n = _int_env(ENV_NUM_PROCESSES)
  if n is None or n <= 1:
    return False
  coord = os.environ.get(ENV_COORDINATOR, "")
  pid = _int_env(ENV_PROCESS_ID)
  if not coord:
    raise ValueError(
      f"{ENV_COORDINATOR}: expected host:port with {ENV_NUM_PROCESSES}={n}, got nothing"
    )
  if pid is None or not 0 <= pid < n:
    raise ValueError(f"{ENV_PROCESS_ID}: expected an integer in [0, {n}), got {pid!r}")
  if jax.distributed.is_initialized():
    return True
  if "cpu" in os.environ.get("JAX_PLATFORMS", "cpu").split(","):
    # Harmless on GPU hosts (it only selects the CPU backend's collectives).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  kw = {}
  hb = _int_env(ENV_HEARTBEAT)
  if hb is not None:
    kw["heartbeat_timeout_seconds"] = hb
    kw["shutdown_timeout_seconds"] = max(hb, 5)
  kw["initialization_timeout"] = _int_env(ENV_INIT_TIMEOUT, 300)
  jax.distributed.initialize(coordinator_address=coord, num_processes=n, process_id=pid, **kw)
  log.info(
    "jax.distributed: process %d of %d (coordinator %s), %d local / %d global devices",
    jax.process_index(),
    jax.process_count(),
    coord,
    jax.local_device_count(),
    jax.device_count(),
  )
  return True
