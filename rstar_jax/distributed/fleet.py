"""The rollout side as a fleet: which servers each JAX process talks to, and which code pool.

SGLang servers (``rollout.sglang_urls``): process i of N uses ``urls[i::N]`` (round-robin
assignment; each server belongs to one process, which drives it with its own share of the
step's prompts and pushes the weights to it). With fewer servers than processes, process i
shares ``urls[i % len(urls)]`` with the others mapped to it (pushes then repeat the same
version on that server; harmless, but give every process a server). Each process stages its
weight pushes in its own sub-directory ``<staging_dir>/process_<i>`` so no two processes write
the same files.

Code pool (``tool.backend``):
  * "local": a `CodePool` in this process (one per JAX process; default);
  * "http":  a `CodePoolClient` of the service (`launchers.code_pool_server`) at
    ``tool.urls[i % len(tool.urls)]`` for process i;
  * "ray":   a `RayCodePool` (one pool actor per Ray node), connecting with
    ``ray.init(address=tool.ray_address)`` when Ray is not initialised yet.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax

TOOL_BACKENDS = ("local", "http", "ray")


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


def build_tool_pool(tool):
  """The (not yet started) code pool named by ``tool.backend`` (``tool`` a `ToolConfig`)."""
  backend = tool.backend
  if backend == "local":
    from rstar_jax.tools.code_pool import CodePool

    return CodePool(
      num_workers=int(tool.num_workers),
      timeout_s=float(tool.timeout_s),
      memory_limit_mb=int(tool.memory_limit_mb),
    )
  if backend == "http":
    from rstar_jax.tools.client import CodePoolClient
    from rstar_jax.tools.service_token import client_token

    urls = list(tool.urls)
    if not urls:
      raise ValueError(
        "tool.urls: expected at least one code-pool service URL for tool.backend='http', got ()"
      )
    # The service's shared secret comes from this process's $RSTAR_CODE_POOL_TOKEN_FILE or
    # $RSTAR_CODE_POOL_TOKEN (rstar_jax/tools/README.md); a bad token file fails here, at build.
    return CodePoolClient(urls[jax.process_index() % len(urls)], token=client_token())
  if backend == "ray":
    import ray

    from rstar_jax.tools.code_pool import PoolConfig
    from rstar_jax.tools.ray_pool import RayCodePool

    if not ray.is_initialized():
      ray.init(address=tool.ray_address or "auto")
    return RayCodePool(
      PoolConfig(
        num_workers=int(tool.num_workers),
        timeout_s=float(tool.timeout_s),
        memory_limit_mb=int(tool.memory_limit_mb),
      )
    )
  raise ValueError(f"tool.backend: expected one of {TOOL_BACKENDS}, got {backend!r}")
