"""HTTP service authentication (issue 27, class 8): shared-secret tokens, constant-time match,
401s, per-token session namespaces, and the refusal to serve off loopback without a token
(tested on the start-up check itself: no test binds anything but 127.0.0.1)."""

import json
import secrets

import aiohttp
import pytest

from rstar_jax.tools import service_token
from rstar_jax.tools.client import CodePoolClient
from rstar_jax.tools.code_pool import PoolConfig
from rstar_jax.tools.server import CodePoolServer
from rstar_jax.tools.service_token import (
  TOKEN_ENV,
  TOKEN_FILE_ENV,
  TokenSet,
  client_token,
  is_loopback,
  read_tokens,
)

TOKEN_A = secrets.token_hex(16)
TOKEN_B = secrets.token_hex(16)


@pytest.fixture(autouse=True)
def no_token_env(monkeypatch):
  monkeypatch.delenv(TOKEN_ENV, raising=False)
  monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("tok") / "pool.token"
  path.write_text(f"# two clients\n{TOKEN_A}\n\n{TOKEN_B}\n")
  path.chmod(0o600)
  return str(path)


@pytest.fixture(scope="module")
def server(runner, token_file):
  srv = CodePoolServer(
    PoolConfig(num_workers=2, num_templates=1), "127.0.0.1", 0, token_file=token_file
  )
  runner.run(srv.start())
  yield srv
  runner.run(srv.stop())


def _request(runner, server, method, path, headers=None, body=None):
  async def go():
    async with aiohttp.ClientSession() as s:
      url = f"http://127.0.0.1:{server.port}{path}"
      async with s.request(method, url, json=body, headers=headers or {}) as resp:
        return resp.status, await resp.read()

  return runner.run(go())


def test_is_loopback():
  for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
    assert is_loopback(host), host
  for host in ("0.0.0.0", "::", "", "10.1.2.3", "192.168.0.1", "example.com", "fe80::1"):
    assert not is_loopback(host), host


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.1.2.3", "pool.cluster.internal"])
def test_refuses_to_serve_off_loopback_without_a_token(monkeypatch, host):
  cfg = PoolConfig(num_workers=1, num_templates=1)
  with pytest.raises(ValueError, match="not loopback.*without a token"):
    CodePoolServer(cfg, host, 0)
  # With a token (argument or environment) the same host passes the check; nothing is started.
  assert CodePoolServer(cfg, host, 0, token=TOKEN_A).tokens
  monkeypatch.setenv(TOKEN_ENV, TOKEN_B)
  assert CodePoolServer(cfg, host, 0).tokens
  monkeypatch.delenv(TOKEN_ENV)
  assert not CodePoolServer(cfg, "127.0.0.1", 0).tokens  # loopback: a token is optional


def test_token_sources_and_errors(tmp_path):
  f = tmp_path / "t"
  f.write_text(f"{TOKEN_A}\n# comment\n{TOKEN_B}\n")
  f.chmod(0o600)
  assert read_tokens(environ={}) == []
  assert read_tokens(token=TOKEN_A, token_file=str(f), environ={}) == [TOKEN_A]
  assert read_tokens(token_file=str(f), environ={}) == [TOKEN_A, TOKEN_B]
  env = {TOKEN_FILE_ENV: str(f), TOKEN_ENV: "x" * 20}
  assert read_tokens(environ=env) == [TOKEN_A, TOKEN_B]  # the file wins over the variable
  assert read_tokens(environ={TOKEN_ENV: TOKEN_B}) == [TOKEN_B]
  assert client_token(environ={TOKEN_ENV: TOKEN_B}) == TOKEN_B
  assert client_token(environ={}) is None
  with pytest.raises(ValueError, match="exactly one token.*holds 2"):
    client_token(token_file=str(f), environ={})
  with pytest.raises(ValueError, match=r"\$RSTAR_CODE_POOL_TOKEN must be >= 16"):
    read_tokens(environ={TOKEN_ENV: "short"})
  with pytest.raises(ValueError, match="cannot be read"):
    read_tokens(token_file=str(tmp_path / "missing"), environ={})
  (tmp_path / "empty").write_text("# nothing\n\n")
  (tmp_path / "empty").chmod(0o600)
  with pytest.raises(ValueError, match="holds no token"):
    read_tokens(token_file=str(tmp_path / "empty"), environ={})
  (tmp_path / "utf").write_text("caf\u00e9" * 8)
  (tmp_path / "utf").chmod(0o600)
  with pytest.raises(ValueError, match="not ASCII"):
    read_tokens(token_file=str(tmp_path / "utf"), environ={})


def test_token_match_compares_every_token_in_constant_time(monkeypatch):
  """Each presented token is hashed to a fixed length and compared with every configured one
  through hmac.compare_digest: no early exit, no length or prefix leaking through timing."""
  calls = []
  real = service_token.hmac.compare_digest

  def spy(a, b):
    calls.append((len(a), len(b)))
    return real(a, b)

  monkeypatch.setattr(service_token.hmac, "compare_digest", spy)
  tokens = TokenSet([TOKEN_A, TOKEN_B, secrets.token_hex(16)])
  for presented, found in ((TOKEN_A, True), ("x", False), (TOKEN_A[:-1], False), ("", False)):
    calls.clear()
    assert (tokens.namespace(presented) is not None) == found
    assert calls == [(32, 32)] * 3
  assert tokens.namespace(TOKEN_A) != tokens.namespace(TOKEN_B)
  assert tokens.namespace(None) is None


def test_requests_without_the_right_token_get_401(runner, server):
  body = {"requests": [{"code": "print('ran')"}]}
  for headers in (
    {},
    {"Authorization": f"Bearer {secrets.token_hex(16)}"},
    {"Authorization": f"Bearer {TOKEN_A[:-1]}"},
    {"Authorization": f"Basic {TOKEN_A}"},
    {"Authorization": TOKEN_A},
  ):
    for method, path in (("POST", "/execute_batch"), ("GET", "/health")):
      status, raw = _request(runner, server, method, path, headers, body)
      assert status == 401 and "token" in json.loads(raw)["error"], (headers, path, raw)
  status, raw = _request(
    runner, server, "POST", "/execute_batch", {"Authorization": f"Bearer {TOKEN_B}"}, body
  )
  assert status == 200 and json.loads(raw)["results"][0]["stdout"] == "ran\n"
  assert server.pool.stats["calls"] == 1  # none of the refused requests reached the pool


def test_client_sends_its_token_and_a_401_is_not_retried(runner, server, token_file):
  url = f"http://127.0.0.1:{server.port}"

  async def go(**kw):
    async with CodePoolClient(url, max_retries=3, backoff_s=0.01, **kw) as c:
      return await c.execute("print(6 * 7)"), c.stats

  r, stats = runner.run(go(token=TOKEN_A))
  assert (r.status, r.stdout) == ("ok", "42\n")
  r, stats = runner.run(go(token=secrets.token_hex(16)))
  assert r.status == "internal_error" and "HTTP 401" in r.stderr
  assert stats["retries"] == 0
  r, stats = runner.run(go())  # no token configured anywhere
  assert r.status == "internal_error" and "HTTP 401" in r.stderr


def test_sessions_live_in_the_namespace_of_their_token(runner, server):
  url = f"http://127.0.0.1:{server.port}"

  async def go():
    async with CodePoolClient(url, token=TOKEN_A) as a, CodePoolClient(url, token=TOKEN_B) as b:
      set_a = await a.execute("secret = 'from A'", session_id="shared-name")
      closed_by_b = await b.close_session("shared-name")
      read_a = await a.execute("print(secret)", session_id="shared-name")
      read_b = await b.execute("print(secret)", session_id="shared-name")
      closed_by_a = await a.close_session("shared-name")
      return set_a, closed_by_b, read_a, read_b, closed_by_a

  set_a, closed_by_b, read_a, read_b, closed_by_a = runner.run(go())
  assert set_a.status == "ok"
  assert closed_by_b is False  # B has no session of that name; A's is out of its reach
  assert (read_a.status, read_a.stdout) == ("ok", "from A\n")
  assert read_b.status == "error" and "NameError" in read_b.stderr  # B got its own interpreter
  assert closed_by_a is True


def test_fleet_http_client_carries_the_token(runner, server, token_file, monkeypatch):
  from configs import rstar2_tiny_cpu
  from rstar_jax.config import from_config_dict
  from rstar_jax.pipelines import wiring

  monkeypatch.setenv(TOKEN_ENV, TOKEN_B)
  cfg = rstar2_tiny_cpu.get_config("rl")
  cfg.tool.backend, cfg.tool.urls = "http", [f"http://127.0.0.1:{server.port}"]
  pool = wiring.tool_pool(from_config_dict(cfg).tool)

  async def go():
    await pool.start()
    try:
      return await pool.execute("print('fleet')")
    finally:
      await pool.close()

  r = runner.run(go())
  assert (r.status, r.stdout) == ("ok", "fleet\n")
