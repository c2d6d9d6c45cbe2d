"""HTTP service + client: same interface as CodePool, micro-batching, retries, queue timeouts."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import aiohttp
import pytest

from rstar_jax.tools.client import CodePoolClient
from rstar_jax.tools.code_pool import PoolConfig
from rstar_jax.tools.server import CodePoolServer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
  s = socket.socket()
  s.bind(("127.0.0.1", 0))
  port = s.getsockname()[1]
  s.close()
  return port


@pytest.fixture(scope="module")
def server(runner):
  srv = CodePoolServer(PoolConfig(num_workers=4, num_templates=1), "127.0.0.1", 0)
  runner.run(srv.start())
  yield srv
  runner.run(srv.stop())


def with_client(runner, url, fn, **kw):
  async def go():
    async with CodePoolClient(url, **kw) as c:
      return await fn(c), c.stats

  return runner.run(go())


def test_client_has_pool_semantics(runner, server):
  url = f"http://127.0.0.1:{server.port}"

  async def fn(c):
    health = await c.health()
    a = await c.execute("print(input()[::-1])", "abc")
    b = await c.execute("1/0")
    s1 = await c.execute("v = 41", session_id="h")
    s2 = await c.execute("v + 1", session_id="h")
    closed = await c.close_session("h")
    t = await c.execute("while True: pass", timeout_s=0.3)
    many = await c.execute_many([{"code": f"{i} * 3"} for i in range(5)])
    return health, a, b, s1, s2, closed, t, many

  (health, a, b, s1, s2, closed, t, many), _ = with_client(runner, url, fn)
  assert health["isolation_level"] == server.pool.isolation_level
  assert (a.status, a.stdout) == ("ok", "cba\n")
  assert b.status == "error" and 'File "<code>", line 1' in b.stderr
  assert s1.status == "ok" and s2.stdout == "42\n" and closed is True
  assert t.status == "timeout"
  assert [r.stdout for r in many] == [f"{i * 3}\n" for i in range(5)]


def test_micro_batching(runner, server):
  url = f"http://127.0.0.1:{server.port}"
  rs, stats = with_client(
    runner,
    url,
    lambda c: c.execute_many([{"code": f"print({i})"} for i in range(40)]),
    max_batch=16,
    max_wait_s=0.05,
  )
  assert [r.stdout for r in rs] == [f"{i}\n" for i in range(40)]
  assert 3 <= stats["batches"] < 40


def test_queue_timeout_is_retried_then_surfaced(runner):
  srv = CodePoolServer(
    PoolConfig(num_workers=1, num_templates=1), "127.0.0.1", 0, queue_timeout_s=0.2
  )
  runner.run(srv.start())
  try:
    rs, stats = with_client(
      runner,
      f"http://127.0.0.1:{srv.port}",
      lambda c: c.execute_many([{"code": "import time\ntime.sleep(1.5)"}] * 3),
      max_retries=1,
      backoff_s=0.05,
    )
  finally:
    runner.run(srv.stop())
  statuses = sorted(r.status for r in rs)
  assert "ok" in statuses and "internal_error" in statuses
  assert any(r.stderr.startswith("queue_timeout") for r in rs)
  assert stats["queue_timeouts"] >= 1 and stats["retries"] >= 1


def test_retries_with_backoff_until_server_appears(runner):
  port = free_port()
  srv = CodePoolServer(PoolConfig(num_workers=1, num_templates=1, preload=()), "127.0.0.1", port)

  async def go():
    async with CodePoolClient(f"http://127.0.0.1:{port}", max_retries=6, backoff_s=0.2) as c:
      call = asyncio.ensure_future(c.execute("print('late')"))
      await asyncio.sleep(0.3)
      await srv.start()
      return await call, c.stats

  try:
    r, stats = runner.run(go())
  finally:
    runner.run(srv.stop())
  assert (r.status, r.stdout) == ("ok", "late\n")
  assert stats["retries"] >= 1 and stats["transport_errors"] >= 1


def test_unreachable_service_is_an_internal_error(runner):
  port = free_port()
  r, stats = with_client(
    runner, f"http://127.0.0.1:{port}", lambda c: c.execute("1"), max_retries=2, backoff_s=0.01
  )
  assert r.status == "internal_error" and "unreachable after 3 tries" in r.stderr
  assert stats["transport_errors"] == 3


def test_bad_requests_name_the_field(runner, server):
  url = f"http://127.0.0.1:{server.port}/execute_batch"

  async def post(body):
    async with aiohttp.ClientSession() as s:
      async with s.post(url, json=body) as resp:
        return resp.status, await resp.json()

  assert runner.run(post({"requests": [{"code": 5}]})) == (
    400,
    {"error": "requests[0].code must be a string, got int"},
  )
  status, body = runner.run(post({"requests": [{"code": "1", "timeout_s": -1}]}))
  assert status == 400 and "requests[0].timeout_s" in body["error"]
  status, body = runner.run(post({"reqs": []}))
  assert status == 400 and "'requests' list" in body["error"]


def test_launcher_serves_health(tmp_path):
  port = free_port()
  env = dict(os.environ, PYTHONPATH=ROOT)
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "launchers.code_pool_server",
      f"--port={port}",
      "--num_workers=1",
      "--num_templates=1",
    ],
    cwd=ROOT,
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
    start_new_session=True,
  )
  try:
    deadline = time.monotonic() + 90
    while True:
      try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
          health = json.loads(resp.read())
        break
      except OSError:
        assert proc.poll() is None and time.monotonic() < deadline, "launcher did not come up"
        time.sleep(0.2)
    assert health["ok"] and health["num_workers"] == 1
    req = urllib.request.Request(
      f"http://127.0.0.1:{port}/execute_batch",
      method="POST",
      data=json.dumps({"requests": [{"code": "6 * 7"}]}).encode(),
      headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
      assert json.loads(resp.read())["results"][0]["stdout"] == "42\n"
  finally:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
