"""The rollout side as a fleet: which servers each JAX process talks to.

SGLang servers (``rollout.sglang_urls``): process i of N uses ``urls[i::N]`` (round-robin
assignment; each server belongs to one process, which drives it with its own share of the
step's prompts and pushes the weights to it). With fewer servers than processes, process i
shares ``urls[i % len(urls)]`` with the others mapped to it (pushes then repeat the same
version on that server; harmless, but give every process a server). Each process stages its
weight pushes in its own sub-directory ``<staging_dir>/process_<i>`` so no two processes write
the same files.
The code pool each process uses is built by `pipelines.wiring.tool_pool` (``tool.backend``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax


def process_urls(
  urls: Sequence[str], *, process_index: int | None = None, process_count: int | None = None
) -> list[str]:
  """This process's servers (module docstring); every URL with one process."""
  urls = list(urls)
  i = jax.process_index() if process_index is None else process_index
  n = jax.process_count() if process_count is None else process_count
  if not urls:
    raise ValueError("process_urls: expected at least one URL, got []")
  if n == 1:
    return urls
  return urls[i::n] if len(urls) >= n else [urls[i % len(urls)]]


def process_staging_dir(
  staging_dir: str, *, process_index: int | None = None, process_count: int | None = None
) -> str:
  """``staging_dir`` with one process; ``<staging_dir>/process_<i>`` with several."""
  i = jax.process_index() if process_index is None else process_index
  n = jax.process_count() if process_count is None else process_count
  return staging_dir if n == 1 else os.path.join(staging_dir, f"process_{i}")
