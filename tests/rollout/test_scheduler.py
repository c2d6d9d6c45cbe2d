import asyncio

import pytest
from rollout_helpers import FakePool

from rstar_jax.rollout.agent_loop import RolloutSettings, run_agent_loop
from rstar_jax.rollout.scheduler import KVCapacityScheduler, choose_server
from rstar_jax.rollout.sglang_engine import SGLangEngine
from rstar_jax.rollout.testing.mock_sglang import MockSGLangServer


def test_choose_server():
  assert choose_server({"a": 100, "b": 300}, {}, 200) == "b"
  assert choose_server({"a": 100, "b": 300}, {}, 400) is None
  assert choose_server({"a": 300, "b": 300}, {"a": 2, "b": 1}, 10) == "b"
  assert choose_server({"b": 300, "a": 300}, {}, 10) == "a"


def test_admission_waits_for_capacity_fifo_and_sticky():
  async def main():
    s = KVCapacityScheduler(["u1", "u2"], {"u1": 1000, "u2": 1000})
    assert await s.acquire("t1", 600) == "u1"
    assert await s.acquire("t2", 600) == "u2"
    assert await s.acquire("t1", 600) == "u1"  # sticky, no double booking
    assert s.free() == {"u1": 400, "u2": 400}
    order = []

    async def want(tid, budget):
      url = await s.acquire(tid, budget)
      order.append((tid, url))

    w3 = asyncio.create_task(want("t3", 500))
    w4 = asyncio.create_task(want("t4", 100))  # fits now, but t3 is first in line
    while s.max_waiting_seen < 2:  # both have queued (no clock)
      await asyncio.sleep(0)
    for _ in range(10):  # let them run: they must keep waiting
      await asyncio.sleep(0)
    assert order == [] and s.max_waiting_seen == 2
    await s.release("t2")
    await asyncio.gather(w3, w4)
    assert order == [("t3", "u2"), ("t4", "u2")]  # u2 then has 500 free, u1 400
    assert min(s.free().values()) >= 0
    with pytest.raises(ValueError, match="exceeds every server's KV capacity"):
      await s.acquire("huge", 1001)
    s.set_external_usage("u1", 2000)  # someone else fills u1
    assert s.free()["u1"] < 0

  asyncio.run(main())


def test_validation():
  with pytest.raises(ValueError, match="no server"):
    KVCapacityScheduler([])
  with pytest.raises(ValueError, match="utilization"):
    KVCapacityScheduler(["a"], utilization=0)
  with pytest.raises(KeyError, match="unknown server"):
    KVCapacityScheduler(["a"], {"b": 1})


def test_agent_loop_over_mock_servers_respects_kv_capacity(tokenizer):
  """12 trajectories, 2 servers that each hold 2 budgets: never more than 2 per server, each
  trajectory stays on one server, and the capacity comes from /get_server_info."""
  from rstar_jax.tokenization import chat_format as cf

  prompt_len = len(cf.prompt_ids(tokenizer, "rstar2", "q0"))
  budget = 64
  cap = 2 * (prompt_len + budget) + 10
  peak = {}

  async def main():
    servers = [
      await MockSGLangServer(
        vocab_size=len(tokenizer), max_total_num_tokens=cap, token_delay_s=0.001
      ).start()
      for _ in range(2)
    ]
    try:
      async with SGLangEngine([s.url for s in servers], utilization=1.0) as eng:
        orig = eng.scheduler.acquire

        async def acquire(tid, b):
          url = await orig(tid, b)
          act = {u: st["active"] for u, st in eng.scheduler.stats().items()}
          for u, a in act.items():
            peak[u] = max(peak.get(u, 0), a)
          return url

        eng.scheduler.acquire = acquire
        trajs = await run_agent_loop(
          eng,
          tokenizer,
          FakePool(),
          [f"q{i}" for i in range(6)],
          2,
          RolloutSettings(response_budget=budget, seed=1),
        )
        return trajs, servers, eng.scheduler.free()
    finally:
      for s in servers:
        await s.close()

  trajs, servers, free = asyncio.run(main())
  assert len(trajs) == 12 and all(t.finish_reason in ("stop", "length") for t in trajs)
  assert all(len(t.response_ids) <= budget for t in trajs)
  assert max(peak.values()) == 2 and set(peak) == {s.url for s in servers}
  assert free == {s.url: cap for s in servers}  # every lease released
  for s in servers:
    assert all("sampling_seed" in b["sampling_params"] for b in s.requests)
  homes = {}
  for k, s in enumerate(servers):
    for b in s.requests:
      homes.setdefault(b["rid"].rsplit(":", 1)[0], set()).add(k)
  assert all(len(v) == 1 for v in homes.values())


def test_capacity_and_load_read_from_servers():
  async def main():
    servers = [await MockSGLangServer(max_total_num_tokens=c).start() for c in (1000, 3000)]
    try:
      async with SGLangEngine([s.url for s in servers], utilization=0.5, load_refresh_s=0.0) as eng:
        caps = await eng.refresh_capacity()
        assert caps == {servers[0].url: 1000, servers[1].url: 3000}
        assert eng.scheduler.free() == {servers[0].url: 500, servers[1].url: 1500}
        servers[1].external_tokens = 1200  # another client fills the big server
        async with eng.trajectory_lease("t", 400) as url:
          assert url == servers[0].url
          assert eng.scheduler.free()[servers[0].url] == 100
    finally:
      for s in servers:
        await s.close()

  asyncio.run(main())
