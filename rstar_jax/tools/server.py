"""HTTP service for the code pool (aiohttp), bound to loopback by default.

Endpoints (JSON):
  GET  /health         -> {"ok", "isolation_level", "num_workers", "stats"}
  POST /execute_batch  {"requests": [{"code", "stdin"?, "timeout_s"?, "session_id"?}, ...],
                        "queue_timeout_s"?: float}
                       -> {"results": [{"status", "stdout", "stderr", "duration_s", "exit_code"}]}
                       An item that waited longer than queue_timeout_s for a worker comes back
                       with status "queue_timeout" (the client retries it).
  POST /close_session  {"session_id"} -> {"closed": bool}
There is deliberately no endpoint that unpickles functions: run_function stays in-process/Ray.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import Any

from aiohttp import web

from rstar_jax.tools.code_pool import (
  MAX_CODE_BYTES,
  MAX_QUEUE_TIMEOUT_S,
  MAX_TIMEOUT_S,
  CodePool,
  PoolConfig,
  QueueTimeout,
  check_seconds,
)

log = logging.getLogger(__name__)
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _bad(msg: str) -> web.Response:
  return web.json_response({"error": msg}, status=400)


def _no_constant(name: str):
  raise ValueError(f"JSON constant {name} is not allowed (numbers must be finite)")


def _loads(text: str) -> Any:
  """Strict JSON: NaN / Infinity / -Infinity are rejected, not turned into floats."""
  return json.loads(text, parse_constant=_no_constant)


def _parse_item(i: int, item: Any) -> dict:
  if not isinstance(item, dict):
    raise ValueError(f"requests[{i}] must be an object, got {type(item).__name__}")
  if not isinstance(item.get("code"), str):
    raise ValueError(f"requests[{i}].code must be a string, got {type(item.get('code')).__name__}")
  stdin = item.get("stdin", "")
  if not isinstance(stdin, str):
    raise ValueError(f"requests[{i}].stdin must be a string, got {type(stdin).__name__}")
  if len(item["code"]) > MAX_CODE_BYTES or len(stdin) > MAX_CODE_BYTES:
    raise ValueError(f"requests[{i}]: code and stdin must each be <= {MAX_CODE_BYTES} chars")
  timeout = item.get("timeout_s")
  if timeout is not None:
    timeout = check_seconds(f"requests[{i}].timeout_s", timeout, MAX_TIMEOUT_S)
  sid = item.get("session_id")
  if sid is not None and (not isinstance(sid, str) or not 0 < len(sid) <= 1024):
    raise ValueError(
      f"requests[{i}].session_id must be a non-empty string of <= 1024 chars, "
      f"got {type(sid).__name__}"
    )
  return {"code": item["code"], "stdin": stdin, "timeout_s": timeout, "session_id": sid}


class CodePoolServer:
  """Owns a CodePool and serves it; `port=0` picks a free port (see `.port`)."""

  def __init__(
    self,
    config: PoolConfig,
    host: str = "127.0.0.1",
    port: int = 8088,
    queue_timeout_s: float | None = None,
    max_batch: int = 4096,
  ):
    if host not in _LOOPBACK:
      log.warning("code pool server binding %s: anyone who can reach it runs code here", host)
    self.pool = CodePool(config=config)
    self.host, self.port = host, port
    self.queue_timeout_s = queue_timeout_s
    self.max_batch = max_batch
    self._runner: web.AppRunner | None = None

  def app(self) -> web.Application:
    app = web.Application(client_max_size=256 << 20)
    app.router.add_get("/health", self.health)
    app.router.add_post("/execute_batch", self.execute_batch)
    app.router.add_post("/close_session", self.close_session)
    return app

  async def start(self) -> CodePoolServer:
    await self.pool.start()
    self._runner = web.AppRunner(self.app(), access_log=None)
    await self._runner.setup()
    site = web.TCPSite(self._runner, self.host, self.port)
    await site.start()
    self.port = site._server.sockets[0].getsockname()[1]
    log.warning(
      "code pool server on http://%s:%d (isolation %s)",
      self.host,
      self.port,
      self.pool.isolation_level,
    )
    return self

  async def stop(self) -> None:
    if self._runner is not None:
      await self._runner.cleanup()
    await self.pool.close()

  async def __aenter__(self):
    return await self.start()

  async def __aexit__(self, *exc):
    await self.stop()

  async def health(self, request: web.Request) -> web.Response:
    return web.json_response(
      {
        "ok": True,
        "isolation_level": self.pool.isolation_level,
        "num_workers": self.pool.config.num_workers,
        "stats": self.pool.stats,
      }
    )

  async def execute_batch(self, request: web.Request) -> web.Response:
    try:
      body = await request.json(loads=_loads)
    except ValueError as e:
      return _bad(f"body is not JSON: {e}")
    if not isinstance(body, dict) or not isinstance(body.get("requests"), list):
      return _bad("body must be an object with a 'requests' list")
    items = body["requests"]
    if len(items) > self.max_batch:
      return _bad(f"batch of {len(items)} exceeds max_batch={self.max_batch}")
    try:
      parsed = [_parse_item(i, it) for i, it in enumerate(items)]
    except ValueError as e:
      return _bad(str(e))
    qt = body.get("queue_timeout_s", self.queue_timeout_s)
    if qt is not None:
      try:
        qt = check_seconds("queue_timeout_s", qt, MAX_QUEUE_TIMEOUT_S, allow_zero=True)
      except ValueError as e:
        return _bad(str(e))

    async def one(it):
      try:
        r = await self.pool._execute(it["code"], it["stdin"], it["timeout_s"], it["session_id"], qt)
      except QueueTimeout as e:
        return {
          "status": "queue_timeout",
          "stdout": "",
          "stderr": str(e),
          "duration_s": 0.0,
          "exit_code": None,
        }
      return dataclasses.asdict(r)

    results = await asyncio.gather(*(one(it) for it in parsed))
    return web.json_response({"results": results})

  async def close_session(self, request: web.Request) -> web.Response:
    try:
      body = await request.json(loads=_loads)
      sid = body["session_id"]
    except (ValueError, KeyError, TypeError):
      return _bad("body must be an object with a 'session_id' string")
    if not isinstance(sid, str) or not 0 < len(sid) <= 1024:
      return _bad("session_id must be a non-empty string of <= 1024 chars")
    return web.json_response({"closed": await self.pool.close_session(sid)})


async def serve_forever(
  config: PoolConfig, host: str, port: int, queue_timeout_s: float | None = None
) -> None:
  async with CodePoolServer(config, host, port, queue_timeout_s):
    await asyncio.Event().wait()
