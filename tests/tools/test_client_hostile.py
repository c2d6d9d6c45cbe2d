"""The HTTP client under a hostile or broken service (issue 40, class 7): every response path is
read with a bound, every failure resolves every waiting caller, redirects are not followed, and
no credential reaches a result, a log line or an exception message. The stand-in service
(`standin_http.StandIn`) listens on 127.0.0.1 only."""

import asyncio
import logging
import secrets

import pytest
from standin_http import BIG, StandIn

from rstar_jax.tools.client import CodePoolClient

TOKEN = secrets.token_hex(16)


async def _each_path(c):
  """One stateless call, one session call, close_session and health: what each gave back."""
  calls = await asyncio.wait_for(
    asyncio.gather(c.execute("print(1)"), c.execute("x = 1", session_id="s")), 60
  )
  errors = []
  for coro in (c.close_session("other"), c.health()):
    try:
      await asyncio.wait_for(coro, 60)
      errors.append(None)
    except (ValueError, ConnectionError) as e:
      errors.append(e)
  return list(calls), errors


@pytest.mark.parametrize("mode", ["big500", "big500_cl"])
def test_error_bodies_are_read_with_a_bound(runner, mode):
  """A 32 MiB 500 body against a 1 MiB bound, on execute, a session call, close_session and
  health: each is refused after a few KiB, and the stand-in could write no more than the
  kernel's socket buffers hold before the client hung up."""

  async def go():
    async with StandIn(mode) as svc:
      async with CodePoolClient(
        svc.url, token=TOKEN, max_retries=0, max_response_bytes=1 << 20
      ) as c:
        calls, errors = await _each_path(c)
      for _ in range(600):  # until every big response's connection has ended
        if len(svc.sent) == len(svc.requests):
          break
        await asyncio.sleep(0.05)
      return calls, errors, svc.sent

  (plain, sess), errors, sent = runner.run(go(), timeout=120)
  assert plain.status == "internal_error" and "HTTP 500" in plain.stderr
  assert sess.status == "session_lost" and "HTTP 500" in sess.stderr
  assert all(isinstance(e, ValueError) and "HTTP 500" in str(e) for e in errors), errors
  assert len(sent) == 4 and max(sent) < BIG // 2, sent


@pytest.mark.parametrize("depth", [100_000, 300_000])  # parsed on the loop / in a thread
def test_deeply_nested_json_resolves_every_caller(runner, depth):
  async def go():
    async with StandIn("deep", depth=depth) as svc:
      async with CodePoolClient(svc.url, max_retries=2, backoff_s=0.01) as c:
        many = asyncio.gather(*(c.execute(f"print({i})") for i in range(5)))
        calls, errors = await _each_path(c)
        return calls + list(await asyncio.wait_for(many, 60)), errors, len(svc.requests)

  calls, errors, n_requests = runner.run(go(), timeout=120)
  assert [r.status for r in calls] == ["internal_error"] * 7
  assert all("malformed response: RecursionError" in r.stderr for r in calls), calls[0]
  assert all(isinstance(e, ValueError) for e in errors), errors
  assert "RecursionError" in str(errors[1])
  assert n_requests <= 9  # 7 calls, close, health: a malformed body is not fetched again


@pytest.mark.parametrize("mode", ["redirect", "echo401", "echo500", "echo200"])
def test_no_redirect_is_followed_and_no_credential_leaks(runner, mode, caplog):
  """A redirect loop, and error bodies that quote the request's Authorization header back:
  the token appears in no result, exception message or log line, and a redirect is not
  followed (one request per call)."""
  caplog.set_level(logging.DEBUG)

  async def go():
    async with StandIn(mode) as svc:
      async with CodePoolClient(svc.url, token=TOKEN, max_retries=1, backoff_s=0.01) as c:
        calls, errors = await _each_path(c)
      return calls, errors, svc.requests

  calls, errors, requests = runner.run(go(), timeout=120)
  seen = [r.stdout + r.stderr for r in calls] + [str(e) for e in errors] + [caplog.text]
  assert not any(TOKEN in text for text in seen), seen
  if mode == "echo200":  # the results themselves quote the header: passed on without the token
    assert all(r.status == "ok" and "Bearer <token>" in r.stdout + r.stderr for r in calls)
    return
  assert all(r.status in ("internal_error", "session_lost") for r in calls)
  assert all(isinstance(e, ValueError) for e in errors)
  posts = [p for _, p, _ in requests if p == "/execute_batch"]
  if mode == "redirect":
    assert all("redirected (not followed)" in r.stderr for r in calls)
    # the two batches (stateless, session), close_session, health: once each
    assert len(requests) == 4 and len(posts) == 2
  if mode == "echo500":  # a 5xx: the stateless call went once more, the session call did not
    assert len(posts) == 3 and calls[1].status == "session_lost"
