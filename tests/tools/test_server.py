"""HTTP service + client: same interface as CodePool, micro-batching, retries, queue timeouts."""

import asyncio
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import aiohttp
import pytest
from aiohttp import web

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


class FakeService:
  """A stand-in service on 127.0.0.1 whose /execute_batch answers `status` after recording the
  items it got (or never answers, with hang=True): what a crash after running looks like."""

  def __init__(self, status=500, hang=False, body=None):
    self.status, self.hang, self.body = status, hang, body
    self.items = []
    self.release = asyncio.Event()

  async def handle(self, request):
    self.items.extend((await request.json())["requests"])
    if self.hang:
      await self.release.wait()
    if self.body is not None:
      return web.Response(body=self.body, status=self.status, content_type="application/json")
    return web.json_response({"error": "boom"}, status=self.status)

  async def __aenter__(self):
    app = web.Application()
    app.router.add_post("/execute_batch", self.handle)
    self.runner = web.AppRunner(app)
    await self.runner.setup()
    site = web.TCPSite(self.runner, "127.0.0.1", 0)
    await site.start()
    self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    return self

  async def __aexit__(self, *exc):
    self.release.set()
    await self.runner.cleanup()


def test_session_call_is_never_resent_after_a_5xx(runner):
  """A 5xx may come after the batch ran: a session call (`x += 1`) must not run again; the
  stateless call of the same batch is retried."""

  async def go():
    async with FakeService(500) as svc:
      async with CodePoolClient(svc.url, max_retries=3, backoff_s=0.01, max_wait_s=0.05) as c:
        rs = await asyncio.wait_for(
          asyncio.gather(c.execute("x += 1", session_id="s"), c.execute("print(1)")), 30
        )
        return rs, svc.items, c.stats

  (sess, plain), items, stats = runner.run(go())
  assert [it["code"] for it in items].count("x += 1") == 1
  assert [it["code"] for it in items].count("print(1)") == 4
  assert sess.status == "session_lost" and "not re-sent" in sess.stderr
  assert plain.status == "internal_error" and "unreachable after 4 tries" in plain.stderr
  assert stats["retries"] == 3


def test_client_refuses_an_oversized_response(runner):
  """A response over the client's max_response_bytes is an internal_error, read no further and
  not fetched again."""
  huge = json.dumps({"results": [{"status": "ok", "stdout": "x" * 50000, "stderr": ""}]})

  async def go():
    async with FakeService(200, body=huge.encode()) as svc:
      async with CodePoolClient(svc.url, max_retries=3, max_response_bytes=10000) as c:
        return await asyncio.wait_for(c.execute("print(1)"), 30), len(svc.items)

  r, sent = runner.run(go())
  assert r.status == "internal_error" and "max_response_bytes" in r.stderr
  assert sent == 1


def test_close_resolves_every_waiting_caller(runner):
  """One batch in flight (the service never answers), the rest queued behind concurrency=1:
  close() resolves them all instead of leaving them hanging."""

  async def go():
    async with FakeService(hang=True) as svc:
      c = await CodePoolClient(svc.url, max_batch=1, concurrency=1, max_wait_s=0.0).start()
      calls = [asyncio.ensure_future(c.execute(f"print({i})")) for i in range(4)]
      while not svc.items:
        await asyncio.sleep(0.01)
      await c.close()
      rs = await asyncio.wait_for(asyncio.gather(*calls), 10)
      with pytest.raises(RuntimeError, match="not running"):
        await c.execute("1")
      return rs

  rs = runner.run(go())
  assert [r.status for r in rs] == ["internal_error"] * 4
  assert all("closed" in r.stderr for r in rs), rs


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


def test_huge_integer_timeout_is_refused_by_name(runner, server):
  """Any number of digits: a 400 (batch-level field) or an invalid item (item field), never a
  500 the client would retry."""
  body = '{"requests": [{"code": "1"}], "queue_timeout_s": 1' + "0" * 400 + "}"
  status, raw = _post_raw(runner, server, "/execute_batch", body)
  assert status == 400 and "queue_timeout_s" in json.loads(raw)["error"], raw[:200]
  for digits in (400, 5000):  # 5000: past int()'s digit limit
    body = '{"requests": [{"code": "1", "timeout_s": 1' + "0" * digits + '}, {"code": "2"}]}'
    status, raw = _post_raw(runner, server, "/execute_batch", body)
    assert status == 200, raw[:200]
    bad, good = json.loads(raw)["results"]
    assert bad["status"] == "invalid_request" and "requests[0].timeout_s" in bad["stderr"], bad
    assert (good["status"], good["stdout"]) == ("ok", "2\n")


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
  bomb = '{"requests": [' + "[]," * (2 << 20) + "[]]}"  # 6 MiB: ~1 s of json.loads
  status, raw = _post_raw(runner, server, "/execute_batch", bomb)
  assert status == 400 and "JSON values" in json.loads(raw)["error"]
  # commas inside strings are not structure: a comma-heavy stdin still runs
  stdin = "1," * 20000
  body = json.dumps({"requests": [{"code": "print(len(input()))", "stdin": stdin}]})
  status, raw = _post_raw(runner, server, "/execute_batch", body)
  assert status == 200 and json.loads(raw)["results"][0]["stdout"] == "40000\n"
  small = CodePoolServer(
    PoolConfig(num_workers=1, num_templates=1), "127.0.0.1", 0, max_request_bytes=1 << 20
  )
  runner.run(small.start())
  try:
    status, raw = _post_raw(runner, small, "/execute_batch", b"[" + b" " * (2 << 20) + b"]")
    assert status == 413 and "max_request_bytes" in json.loads(raw)["error"]
    # the cap holds for the decompressed body: 64 MiB of spaces as 64 KiB of gzip
    zbomb = gzip.compress(b"[" + b" " * (64 << 20) + b"]", compresslevel=1)
    status, raw = _post_raw(
      runner, small, "/execute_batch", zbomb, headers={"Content-Encoding": "gzip"}
    )
    assert status == 413 and "max_request_bytes" in json.loads(raw)["error"]
  finally:
    runner.run(small.stop())


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
    with pytest.raises(TypeError, match="stdin must be str or bytes, got int"):
      await c.execute("1", 5)
    calls = asyncio.gather(
      c.execute(echo, b"\xff\x00ab"),
      c.execute(echo, "caf\xe9"),
      c.execute(echo, b"\xfe".decode("utf-8", "surrogateescape")),  # as CodePool reads it
      c.execute(echo, bytearray(b"\x00")),
    )
    return await asyncio.wait_for(calls, 60)  # bytes used to hang every caller of the batch

  rs, stats = with_client(runner, url, fn)
  assert [r.stdout for r in rs] == [
    "b'\\xff\\x00ab'\n",
    "b'caf\\xc3\\xa9'\n",
    "b'\\xfe'\n",
    "b'\\x00'\n",
  ]
  assert stats["retries"] == 0


def test_launcher_serves_health(tmp_path):
  """The launcher wires --token_file: without the token a request is a 401, with it served."""
  token = "launcher-test-token-0123456789"
  (tmp_path / "tok").write_text(token + "\n")
  (tmp_path / "tok").chmod(0o600)
  port = free_port()
  env = {k: v for k, v in os.environ.items() if not k.startswith("RSTAR_CODE_POOL_TOKEN")}
  env["PYTHONPATH"] = ROOT
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "launchers.code_pool_server",
      f"--port={port}",
      "--num_workers=1",
      "--num_templates=1",
      f"--token_file={tmp_path / 'tok'}",
    ],
    cwd=ROOT,
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
    start_new_session=True,
  )
  auth = {"Authorization": f"Bearer {token}"}
  try:
    deadline = time.monotonic() + 90
    while True:
      try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/health", headers=auth)
        with urllib.request.urlopen(req, timeout=2) as resp:
          health = json.loads(resp.read())
        break
      except OSError:
        assert proc.poll() is None and time.monotonic() < deadline, "launcher did not come up"
        time.sleep(0.2)
    assert health["ok"] and health["num_workers"] == 1
    body = json.dumps({"requests": [{"code": "6 * 7"}]}).encode()
    headers = {"Content-Type": "application/json"}
    url = f"http://127.0.0.1:{port}/execute_batch"
    with pytest.raises(urllib.error.HTTPError) as e:
      urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=30)
    assert e.value.code == 401
    req = urllib.request.Request(url, body, {**headers, **auth})
    with urllib.request.urlopen(req, timeout=30) as resp:
      assert json.loads(resp.read())["results"][0]["stdout"] == "42\n"
  finally:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)


def test_launcher_bad_token_file_is_one_line(tmp_path):
  missing = tmp_path / "no-such.token"
  proc = subprocess.run(
    [sys.executable, "-m", "launchers.code_pool_server", f"--token_file={missing}"],
    cwd=ROOT,
    env=dict(os.environ, PYTHONPATH=ROOT),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines()[-1] == (
    f"code_pool_server: token file '{missing}' cannot be read: No such file or directory"
  )
  assert "Traceback" not in proc.stderr


def test_sixteen_mib_of_control_characters_stay_sixteen_mib():
  """The red team's case at the encoder: 16 MiB of output used to be a ~96 MiB response."""
  from rstar_jax.tools.server import encode_results

  field = (16 << 20) + 4096
  r = {"status": "ok", "stdout": "\x01" * (16 << 20), "stderr": "", "duration_s": 0.1}
  raw = encode_results([r, dict(r, stdout="short")], field, 256 << 20)
  assert len(raw) <= field + 1024
  first, second = json.loads(raw)["results"]
  assert first["status"] == "output_limit" and first["stdout"].endswith("bytes as JSON]\n")
  assert (second["status"], second["stdout"]) == ("ok", "short")
