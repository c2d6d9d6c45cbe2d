"""Tool node failure (issue 41, item 3): the HTTP client over several code-pool services. A
stateless call whose node died is re-sent to another node; a session call whose node died comes
back `session_lost` (never re-run on a fresh session); a node that comes back rejoins. Failures
are injected: kill -9 of a service process, a node that hangs, one that answers 5xx forever.
Every service listens on 127.0.0.1."""

import asyncio

import pytest
from standin_http import StandIn

from rstar_jax.rollout.testing.processes import ToolNodeProcess
from rstar_jax.tools.client import CodePoolClient
from rstar_jax.tools.code_pool import PoolConfig
from rstar_jax.tools.server import CodePoolServer
from rstar_jax.tools.service_token import TOKEN_ENV, TOKEN_FILE_ENV


@pytest.fixture(autouse=True)
def no_token_env(monkeypatch):
  monkeypatch.delenv(TOKEN_ENV, raising=False)
  monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)


@pytest.fixture(scope="module")
def server(runner):
  srv = CodePoolServer(PoolConfig(num_workers=2, num_templates=1), "127.0.0.1", 0)
  runner.run(srv.start())
  yield srv
  runner.run(srv.stop())


async def _until(pred, what, tries=600):
  for _ in range(tries):
    if pred():
      return
    await asyncio.sleep(0.05)
  raise AssertionError(f"timed out waiting for {what}")


def test_hung_and_failing_nodes_are_routed_around(runner, server):
  """Nodes [hangs, 5xx forever, real]: the session opened on the hung node comes back
  session_lost and is never sent elsewhere; stateless calls all succeed on the real node; the
  two bad nodes stay out of rotation until the 5xx one answers again, then it rejoins."""

  async def go():
    async with StandIn("hang") as hung, StandIn("500") as failing:
      urls = [hung.url, failing.url, f"http://127.0.0.1:{server.port}"]
      async with CodePoolClient(
        urls,
        request_timeout_s=1.0,
        probe_interval_s=0.1,
        probe_timeout_s=0.3,
        max_retries=4,
        backoff_s=0.01,
      ) as c:
        sess = await c.execute("x = 1", session_id="s")  # first pick: the hung node
        plain = await asyncio.gather(*(c.execute(f"print({i})") for i in range(6)))
        await asyncio.sleep(0.5)  # a few probes: neither bad node answers /health
        down = [n.up for n in c.nodes]
        failing.mode = "ok"  # the 5xx node recovers
        await _until(lambda: c.nodes[1].up, "the recovered node to rejoin")
        after = await asyncio.gather(*(c.execute("print(0)") for _ in range(8)))
        stats = dict(c.stats)
      return sess, plain, down, after, stats, hung.requests, failing.requests

  sess, plain, down, after, stats, hung_reqs, failing_reqs = runner.run(go(), timeout=120)
  assert sess.status == "session_lost" and "not re-sent" in sess.stderr
  assert [r.stdout for r in plain] == [f"{i}\n" for i in range(6)]
  assert down == [False, False, True]
  assert stats["resent_to_other_node"] >= 1 and stats["nodes_rejoined"] >= 1
  batches = [b for _, p, b in hung_reqs + failing_reqs if p == "/execute_batch"]
  session_items = [it for b in batches for it in b["requests"] if "session_id" in it]
  assert len(session_items) == 1  # the session call went to its own node once, nowhere else
  assert all(r.status == "ok" for r in after)
  assert any(r.stdout == "from stand-in\n" for r in after)  # traffic reaches it again


def test_killed_node_loses_its_sessions_and_rejoins(runner, server):
  """kill -9 of one service process: its sessions answer session_lost (one while it is down,
  one after it restarted: the restarted service refuses a session of its earlier run without
  running it), stateless calls go to the other node, and the restarted node rejoins; the next
  call on a lost session opens a fresh one and says so. The node is the chaos benchmark's
  `ToolNodeProcess` (its kill9 takes the service's sandboxes too; start(port) brings it back)."""
  node = ToolNodeProcess(num_workers=1, num_templates=1).start()

  async def go():
    await asyncio.to_thread(node.wait_ready)
    assert node.running_requests() == -1  # not reported by the service: kills land anywhere
    urls = [node.url, f"http://127.0.0.1:{server.port}"]
    async with CodePoolClient(urls, probe_interval_s=0.1, max_retries=2, backoff_s=0.05) as c:
      for i in range(4):
        assert (await c.execute(f"v = {i}", session_id=f"s{i}")).status == "ok"
      on_killed = [f"s{i}" for i in range(4) if c._sessions[f"s{i}"].node == 0]
      assert len(on_killed) >= 2, on_killed
      port = node.port
      node.kill9()
      assert not node.alive()
      while_down = await c.execute("print(v)", session_id=on_killed[0])
      plain = await asyncio.gather(*(c.execute(f"print({i})") for i in range(4)))
      node.start(port=port)
      assert await asyncio.to_thread(node.wait_ready) == f"http://127.0.0.1:{port}"
      health = await asyncio.to_thread(node.health)
      after_restart = await c.execute("print(v)", session_id=on_killed[1])
      await _until(lambda: c.nodes[0].up, "the restarted node to rejoin")
      fresh = await c.execute("print(v)", session_id=on_killed[0])
      again = await c.execute("v = 7; print(v)", session_id=on_killed[0])
      return while_down, plain, health, after_restart, fresh, again, dict(c.stats)

  try:
    while_down, plain, health, after_restart, fresh, again, stats = runner.run(go(), timeout=240)
    restarted = node.health()
  finally:
    node.stop()
  assert not node.alive()
  assert while_down.status == "session_lost" and "refuses connections" in while_down.stderr
  assert [r.stdout for r in plain] == [f"{i}\n" for i in range(4)]
  assert after_restart.status == "session_lost" and "restarted" in after_restart.stderr
  assert restarted["stats"]["sessions_lost"] == 1  # refused by the restarted service, not run
  assert health["service_id"] == restarted["service_id"]
  # The lost session's next call is a fresh session (its variable is gone) and says so.
  assert fresh.status == "error" and "NameError" in fresh.stderr
  assert fresh.stdout.startswith("[session lost earlier")
  assert again.stdout == "7\n"
  assert stats["sessions_lost"] == 2 and stats["nodes_rejoined"] >= 1


def test_the_fleet_config_gives_the_client_every_url():
  """`tool.urls` with several nodes: the http backend's client gets them all (process 0 starts at
  the first); nothing is contacted."""
  from configs import rstar2_tiny_cpu
  from rstar_jax.config import from_config_dict
  from rstar_jax.pipelines import wiring

  cfg = rstar2_tiny_cpu.get_config("rl")
  urls = ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]
  cfg.tool.backend, cfg.tool.urls = "http", urls
  pool = wiring.tool_pool(from_config_dict(cfg).tool)
  assert isinstance(pool, CodePoolClient) and [n.url for n in pool.nodes] == urls
