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


def _post_raw(runner, server, path, raw, headers=None):
  async def go():
    async with aiohttp.ClientSession() as s:
      h = {"Content-Type": "application/json", **(headers or {})}
      async with s.post(f"http://127.0.0.1:{server.port}{path}", data=raw, headers=h) as resp:
        return resp.status, await resp.read()

  return runner.run(go())


def test_bad_requests_name_the_field(runner, server):
  status, raw = _post_raw(runner, server, "/execute_batch", json.dumps({"requests": [{"code": 5}]}))
  assert status == 200
  (r,) = json.loads(raw)["results"]
  assert r["status"] == "invalid_request"
  assert r["stderr"] == "requests[0].code must be a string, got int\n"
  status, raw = _post_raw(runner, server, "/execute_batch", json.dumps({"reqs": []}))
  assert status == 400 and "'requests' list" in json.loads(raw)["error"]


def test_one_invalid_item_fails_alone(runner, server):
  """Each bad item fails by itself; the co-batched session call runs once and returns."""
  batch = [
    {"code": "n = globals().get('n', 0) + 1; print(n)", "session_id": "alone"},
    {"code": "1", "stdin": "\ud800"},  # lone surrogate (json.dumps escapes it)
    {"code": "1", "session_id": "s" * 2000},
    {"code": ["not", "a", "string"]},
    {"code": "1", "timeout_s": 10**400},
    {"code": "1", "timeout_s": -1},
    {"code": "1", "stdin_b64": "%%%"},
    {"code": "print(input())", "stdin": "fine"},
  ]
  status, raw = _post_raw(runner, server, "/execute_batch", json.dumps({"requests": batch}))
  assert status == 200, raw[:300]
  rs = json.loads(raw)["results"]
  assert (rs[0]["status"], rs[0]["stdout"]) == ("ok", "1\n")
  assert (rs[7]["status"], rs[7]["stdout"]) == ("ok", "fine\n")
  fields = ["stdin", "session_id", "code", "timeout_s", "timeout_s", "stdin_b64"]
  for r, field in zip(rs[1:7], fields):
    assert r["status"] == "invalid_request" and f"].{field}" in r["stderr"], r
  # the session call ran exactly once
  _, raw = _post_raw(
    runner,
    server,
    "/execute_batch",
    json.dumps({"requests": [{"code": "print(n)", "session_id": "alone"}]}),
  )
  assert json.loads(raw)["results"][0]["stdout"] == "1\n"


def test_body_level_errors_are_4xx_not_5xx(runner, server):
  for body in (
    '{"requests": [{"code": "1"}], "queue_timeout_s": 1' + "0" * 400 + "}",
    '{"requests": [{"code": "1", "timeout_s": 1' + "0" * 5000 + "}]}",  # > int digit limit
  ):
    status, raw = _post_raw(runner, server, "/execute_batch", body)
    assert status == 400 and "error" in json.loads(raw), raw[:200]


def test_response_is_bounded(runner, server):
  """1 MiB of control characters: 6 MiB of JSON before; now cut to the field's limit."""
  n = (1 << 20) - 64
  code = f"import sys; sys.stdout.write(chr(1) * {n})"
  status, raw = _post_raw(
    runner, server, "/execute_batch", json.dumps({"requests": [{"code": code}]})
  )
  assert status == 200
  assert len(raw) <= server.pool.config.max_output_bytes + 8192
  (r,) = json.loads(raw)["results"]
  assert r["status"] == "output_limit"
  assert (
    r["stdout"].startswith("\x01" * 1000) and "output cut by the code pool service" in r["stdout"]
  )
  server.max_response_bytes = 4000  # the whole response too: later items say they were dropped
  try:
    big = {"code": "print('x' * 3000)"}
    _, raw = _post_raw(runner, server, "/execute_batch", json.dumps({"requests": [big] * 3}))
  finally:
    server.max_response_bytes = 256 << 20
  assert len(raw) < 4000 + 1000
  rs = json.loads(raw)["results"]
  assert rs[0]["status"] == "ok" and rs[0]["stdout"] == "x" * 3000 + "\n"
  assert [r["status"] for r in rs[1:]] == ["output_limit"] * 2
  assert "result dropped" in rs[1]["stderr"] and "status was ok" in rs[1]["stderr"]


def test_json_parsing_is_bounded(runner, server):
  """A list bomb under the byte limit is refused before parsing; a body over it with 413."""
  bomb = '{"requests": [' + "[]," * (2 << 20) + "[]]}"
  t0 = time.monotonic()
  status, raw = _post_raw(runner, server, "/execute_batch", bomb)
  took = time.monotonic() - t0
  assert status == 400 and "JSON values" in json.loads(raw)["error"]
  assert took < 1.0, took  # parsing it took ~1 s on its own
  # commas inside strings are not structure: a comma-heavy stdin still runs
  stdin = "1," * 20000
  body = json.dumps({"requests": [{"code": "print(len(input()))", "stdin": stdin}]})
  status, raw = _post_raw(runner, server, "/execute_batch", body)
  assert status == 200 and json.loads(raw)["results"][0]["stdout"] == "40000\n"
  limit, server.max_request_bytes = server.max_request_bytes, 1 << 20
  try:
    srv_app_limit = server._runner.app._client_max_size
    server._runner.app._client_max_size = 1 << 20
    status, _ = _post_raw(runner, server, "/execute_batch", b"[" + b" " * (2 << 20) + b"]")
  finally:
    server.max_request_bytes, server._runner.app._client_max_size = limit, srv_app_limit
  assert status == 413


def test_bytes_stdin_and_call_site_errors(runner, server):
  url = f"http://127.0.0.1:{server.port}"
  echo = "import sys; print(sys.stdin.buffer.read())"

  async def fn(c):
    with pytest.raises(ValueError, match="stdin holds a lone surrogate"):
      await c.execute("1", "\ud800")
    with pytest.raises(ValueError, match="session_id"):
      await c.execute("1", session_id="s" * 2000)
    with pytest.raises(ValueError, match="timeout_s"):
      await c.execute("1", timeout_s=10**400)
    return await asyncio.gather(
      c.execute(echo, b"\xff\x00ab"),
      c.execute(echo, "caf\xe9"),
      c.execute(echo, b"\xfe".decode("utf-8", "surrogateescape")),  # as CodePool reads it
    )

  rs, stats = with_client(runner, url, fn)
  assert [r.stdout for r in rs] == ["b'\\xff\\x00ab'\n", "b'caf\\xc3\\xa9'\n", "b'\\xfe'\n"]
  assert stats["retries"] == 0


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
