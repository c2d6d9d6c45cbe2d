"""Threat class 2: numbers at every public entry. NaN, infinities, negatives, huge values, bools
and strings are refused with a clear ValueError (HTTP 400), before anything is allocated, and a
flood of bad calls leaves the pool exactly as it was."""

import asyncio
import json

import aiohttp
import pytest
from pool_helpers import use_level_runner

from rstar_jax.tools.code_pool import MAX_QUEUE_TIMEOUT_S, MAX_TIMEOUT_S, CodePool, PoolConfig
from rstar_jax.tools.server import CodePoolServer

BAD_SECONDS = [
  float("nan"),
  float("inf"),
  -float("inf"),
  -1.0,
  0.0,
  MAX_TIMEOUT_S * 2,
  2.2e6,
  1e300,
  True,
  "1",
]

runner = use_level_runner()


def _free_uids(runner, pool):
  return sum(r["free_uids"] for r in runner.run(pool.ping()))


def _all_uids_back(runner, pool):
  """Waits (uids come back once a call's namespace is reaped, asynchronously) until every uid
  of the pool is free again; returns whether they all came back."""
  full = len(pool._templates) * pool.config.uids_per_template
  for _ in range(100):
    if _free_uids(runner, pool) == full:
      return True
    runner.run(asyncio.sleep(0.05))
  return False


@pytest.mark.parametrize("bad", BAD_SECONDS, ids=repr)
def test_every_entry_refuses_bad_timeouts(runner, lpool, bad):
  with pytest.raises(ValueError, match="timeout_s"):
    runner.run(lpool.execute("1", timeout_s=bad))
  with pytest.raises(ValueError, match="timeout_s"):
    runner.run(lpool.execute("1", timeout_s=bad, session_id="n"))
  with pytest.raises(ValueError, match="timeout_s"):
    runner.run(lpool.execute_many([{"code": "1", "timeout_s": bad}]))
  with pytest.raises(ValueError, match="timeout_s"):
    runner.run(lpool.run_function(divmod, 1, 1, timeout_s=bad))
  # Zero is a valid queue timeout (fail at once when no worker is free); its bound is higher.
  if not (type(bad) is float and 0.0 <= bad <= MAX_QUEUE_TIMEOUT_S):
    with pytest.raises(ValueError, match="queue_timeout_s"):
      runner.run(lpool.execute("1", queue_timeout_s=bad))


def test_bad_call_flood_leaks_nothing_and_never_freezes_the_loop(runner, lpool):
  async def flood():
    ticks = 0

    async def ticker():
      nonlocal ticks
      for _ in range(20):
        await asyncio.sleep(0.01)
        ticks += 1

    t = asyncio.ensure_future(ticker())
    for i in range(1200):
      for bad in (float("nan"), float("inf")):
        try:
          await lpool.execute("1", timeout_s=bad)
        except ValueError:
          pass
    await asyncio.wait_for(t, 10)  # the loop kept running: no NaN timer froze it
    return ticks, await lpool.execute("print('alive')")

  ticks, r = runner.run(flood())
  assert ticks == 20 and (r.status, r.stdout) == ("ok", "alive\n")
  assert _all_uids_back(runner, lpool)


@pytest.mark.parametrize(
  "field,value",
  [
    ("timeout_s", float("nan")),
    ("timeout_s", float("inf")),
    ("timeout_s", -1.0),
    ("reply_grace_s", float("nan")),
    ("startup_timeout_s", float("inf")),
    ("queue_timeout_s", float("nan")),
    ("memory_limit_mb", 1.5),
    ("max_procs", True),
    ("max_output_bytes", 1 << 40),
    ("session_timeout_cpu_s", 10**9),
  ],
)
def test_pool_config_refuses_bad_numbers(field, value):
  with pytest.raises(ValueError, match=f"PoolConfig.{field}"):
    PoolConfig(**{field: value})


def test_session_id_and_sizes_are_checked(runner, lpool):
  with pytest.raises(ValueError, match="session_id"):
    runner.run(lpool.execute("1", session_id=""))
  with pytest.raises(ValueError, match="session_id"):
    runner.run(lpool.execute("1", session_id=7))
  with pytest.raises(ValueError, match="session_id"):
    runner.run(lpool.close_session("x" * 5000))
  with pytest.raises(ValueError, match="code and stdin"):
    runner.run(lpool.execute("1", stdin="x" * ((64 << 20) + 1)))


def test_start_failure_frees_what_it_took(runner):
  # A template that cannot start the call (no uid left) answers internal_error and keeps
  # nothing: after many refused calls, every uid and scratch dir is back.
  pool = CodePool(num_workers=16, num_templates=1, uids_per_template=8, preload=(), timeout_s=3.0)
  runner.run(pool.start())
  try:

    async def burst():
      return await asyncio.gather(
        *(pool.execute("import time\ntime.sleep(0.5)", timeout_s=2.0) for _ in range(16))
      )

    rs = runner.run(burst())
    assert {r.status for r in rs} <= {"ok", "internal_error"}
    assert any("no free sandbox uid" in r.stderr for r in rs)
    r = runner.run(pool.execute("print(1)"))
    assert r.stdout == "1\n"
    assert _all_uids_back(runner, pool)
  finally:
    runner.run(pool.close())


@pytest.fixture(scope="module")
def server(runner):
  srv = CodePoolServer(PoolConfig(num_workers=4, num_templates=1, preload=()), "127.0.0.1", 0)
  runner.run(srv.start())
  yield srv
  runner.run(srv.stop())


def _post(runner, server, path, raw):
  async def go():
    async with aiohttp.ClientSession() as s:
      async with s.post(
        f"http://127.0.0.1:{server.port}{path}",
        data=raw,
        headers={"Content-Type": "application/json"},
      ) as resp:
        return resp.status, await resp.text()

  return runner.run(go())


@pytest.mark.parametrize(
  "raw, refused",
  [
    # A non-JSON constant or a bad batch-level field: the whole body is a 400.
    ('{"requests": [{"code": "1", "timeout_s": NaN}]}', "body"),
    ('{"requests": [{"code": "1", "timeout_s": Infinity}]}', "body"),
    ('{"requests": [{"code": "1", "timeout_s": -Infinity}]}', "body"),
    ('{"requests": [{"code": "1"}], "queue_timeout_s": NaN}', "body"),
    ('{"requests": [{"code": "1"}], "queue_timeout_s": -1}', "body"),
    # A bad item field: that item alone is invalid_request (issue 27), naming the field.
    ('{"requests": [{"code": "1", "timeout_s": 1e309}]}', "requests[0].timeout_s"),
    ('{"requests": [{"code": "1", "timeout_s": 3e6}]}', "requests[0].timeout_s"),
    ('{"requests": [{"code": "1", "timeout_s": true}]}', "requests[0].timeout_s"),
    ('{"requests": [{"code": "1", "session_id": ""}]}', "requests[0].session_id"),
  ],
)
def test_http_refuses_non_finite_and_out_of_range(runner, server, raw, refused):
  status, text = _post(runner, server, "/execute_batch", raw)
  if refused == "body":
    assert status == 400 and "error" in json.loads(text), text
  else:
    assert status == 200, text
    (r,) = json.loads(text)["results"]
    assert r["status"] == "invalid_request" and refused in r["stderr"], r


def test_http_bad_batch_flood_does_not_wedge(runner, server):
  bad = json.dumps({"requests": [{"code": "1", "timeout_s": 1e9}] * 1032})
  calls = server.pool.stats["calls"]
  for _ in range(3):
    status, text = _post(runner, server, "/execute_batch", bad)
    assert status == 200
    assert {r["status"] for r in json.loads(text)["results"]} == {"invalid_request"}
  assert server.pool.stats["calls"] == calls  # none of them ran
  assert _post(runner, server, "/close_session", '{"session_id": NaN}')[0] == 400
  good = json.dumps({"requests": [{"code": f"print({i})"} for i in range(40)]})
  status, text = _post(runner, server, "/execute_batch", good)
  assert status == 200
  assert [r["stdout"] for r in json.loads(text)["results"]] == [f"{i}\n" for i in range(40)]


def test_http_client_refuses_bad_numbers():
  from rstar_jax.tools.client import CodePoolClient

  for bad in (float("nan"), float("inf"), -1.0):
    with pytest.raises(ValueError, match="queue_timeout_s"):
      CodePoolClient("http://127.0.0.1:1", queue_timeout_s=bad)
    with pytest.raises(ValueError, match="request_timeout_s"):
      CodePoolClient("http://127.0.0.1:1", request_timeout_s=bad)

  async def go():
    async with CodePoolClient("http://127.0.0.1:1") as c:  # nothing is ever sent
      with pytest.raises(ValueError, match="timeout_s"):
        await c.execute("1", timeout_s=float("nan"))

  loop = asyncio.new_event_loop()
  loop.run_until_complete(go())
  loop.close()
