"""Process 0 ("primary") does the run's host-side writing: metrics JSONL, TensorBoard, progress
lines, summary files. The others compute the same values (they see the same gathered data) and
write nothing, so no file is written twice or raced on.
"""

from __future__ import annotations

import jax


def process_index() -> int:
  return jax.process_index()


def process_count() -> int:
  return jax.process_count()


def is_primary() -> bool:
  """True in process 0 (and in every single-process run)."""
  return jax.process_index() == 0


def sync(name: str) -> None:
  """Barrier over all processes (no-op with one): e.g. the primary wrote a file the others
  read next."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)
