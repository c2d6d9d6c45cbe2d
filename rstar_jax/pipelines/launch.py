"""What every launcher does before and after the run: logging, joining a multi-host job, and
printing the summary.
"""

from __future__ import annotations

import json
import logging
import os

import jax
from absl import logging as absl_logging

from rstar_jax.distributed import init as dist_init

log = logging.getLogger(__name__)


def maybe_initialize_distributed() -> bool:
  """``jax.distributed.initialize()`` when a multi-host environment is detected.

  Detected from the variables JAX's own cluster detection or common launchers set
  (coordinator address, SLURM, Open MPI, Kubernetes JobSet / TPU pods), or the ``RSTAR_*``
  variables of `scripts/local_cluster.sh` (`rstar_jax.distributed.init`). Returns whether it ran.
  """
  if dist_init.initialize_from_env():
    return True
  keys = (
    "JAX_COORDINATOR_ADDRESS",
    "COORDINATOR_ADDRESS",
    "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_SIZE",
    "JOBSET_NAME",
    "MEGASCALE_COORDINATOR_ADDRESS",
  )
  num = (
    os.getenv("JAX_NUM_PROCESSES") or os.getenv("SLURM_NTASKS") or os.getenv("OMPI_COMM_WORLD_SIZE")
  )
  if not any(k in os.environ for k in keys):
    return False
  if num is not None and int(num) <= 1:
    return False
  jax.distributed.initialize()
  log.info(
    "jax.distributed initialised: process %d of %d", jax.process_index(), jax.process_count()
  )
  return True


def setup_logging(level: int = logging.INFO) -> None:
  """Launcher logging: our progress at INFO, orbax/absl chatter at WARNING."""
  logging.basicConfig(
    level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
  )
  for name in ("absl", "orbax", "jax", "jax._src"):
    logging.getLogger(name).setLevel(logging.WARNING)
  absl_logging.set_verbosity(absl_logging.WARNING)


def summary_json(d: dict) -> str:
  """The JSON-serialisable part of a loop's summary dict (objects like the learner dropped)."""
  out = {}
  for k, v in d.items():
    try:
      json.dumps(v)
    except TypeError:
      continue
    out[k] = v
  return json.dumps(out, indent=1, sort_keys=True)
