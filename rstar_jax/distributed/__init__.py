"""Multi-process (multi-controller) JAX helpers: start-up, host-data exchange, primary-only IO.

  * `init`: ``jax.distributed.initialize`` from the environment `scripts/local_cluster.sh` (or a
    cluster launcher) sets, with gloo collectives on CPU and short failure detection.
  * `hostdata`: which of the step's prompts this process rolls out, all-gathers of host-side
    Python data (trajectories, rewards), global arrays from host rows, host copies of sharded
    arrays.
  * `primary`: process 0 writes metrics, progress lines and summaries; everyone else is quiet.

Every helper is a no-op (or the identity) in a single-process run.
"""

from rstar_jax.distributed.primary import is_primary, process_count, process_index  # noqa: F401
