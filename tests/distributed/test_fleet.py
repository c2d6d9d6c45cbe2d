"""Which servers / code pool each JAX process uses (`rstar_jax.distributed.fleet`)."""

import asyncio

import pytest

from configs import rstar2_tiny_cpu
from rstar_jax.config import from_config_dict
from rstar_jax.config.checks import ConfigError
from rstar_jax.distributed import fleet
from rstar_jax.pipelines import wiring

URLS = [f"http://127.0.0.1:{3000 + i}" for i in range(5)]


def test_each_server_belongs_to_one_process():
  parts = [fleet.process_urls(URLS, process_index=i, process_count=2) for i in range(2)]
  assert parts == [URLS[0::2], URLS[1::2]]
  assert fleet.process_urls(URLS) == URLS  # one process: every server
  # Fewer servers than processes: shared round-robin.
  assert [fleet.process_urls(URLS[:2], process_index=i, process_count=3) for i in range(3)] == [
    [URLS[0]],
    [URLS[1]],
    [URLS[0]],
  ]
  with pytest.raises(ValueError, match="at least one URL"):
    fleet.process_urls([])


def test_staging_dir_is_per_process():
  assert fleet.process_staging_dir("/s") == "/s"
  assert fleet.process_staging_dir("/s", process_index=1, process_count=2) == "/s/process_1"


def test_tool_backend_is_validated():
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.tool.backend = "carrier-pigeon"
  with pytest.raises(ConfigError, match="tool.backend"):
    from_config_dict(cfg)
  cfg.tool.backend = "http"
  with pytest.raises(ConfigError, match="tool.urls"):
    from_config_dict(cfg)
  cfg.tool.urls = ["http://127.0.0.1:1"]
  assert from_config_dict(cfg).tool.urls == ("http://127.0.0.1:1",)


def test_http_backend_runs_code_through_the_service():
  from rstar_jax.tools.code_pool import PoolConfig
  from rstar_jax.tools.server import CodePoolServer

  cfg = rstar2_tiny_cpu.get_config("rl")

  async def go():
    async with CodePoolServer(PoolConfig(num_workers=2, num_templates=1), "127.0.0.1", 0) as srv:
      cfg.tool.backend, cfg.tool.urls = "http", [f"http://127.0.0.1:{srv.port}"]
      pool = wiring.tool_pool(from_config_dict(cfg).tool)
      assert type(pool).__name__ == "CodePoolClient"
      await pool.start()
      try:
        return await pool.execute("print(6 * 7)")
      finally:
        await pool.close()

  r = asyncio.run(go())
  assert r.status == "ok" and r.stdout.strip() == "42"


def test_local_backend_is_the_default():
  tool = from_config_dict(rstar2_tiny_cpu.get_config("rl")).tool
  assert tool.backend == "local"
  assert type(wiring.tool_pool(tool)).__name__ == "CodePool"
