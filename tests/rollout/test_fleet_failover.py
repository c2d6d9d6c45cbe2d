"""Rollout server failures (issue 41, item 1) against SGLang stand-ins on 127.0.0.1: a server
killed with SIGKILL mid-turn, one that hangs, one answering 5xx forever, one that comes back
with old weights, and the whole fleet gone past ``server_timeout_s``. Each server gets its own
``logprob_shift``, so a turn's log-probs tell which server produced every token of it."""

import asyncio
import os
import signal
import subprocess
import sys

import aiohttp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rstar_jax.errors import CheckpointedStop
from rstar_jax.models import qwen3
from rstar_jax.rollout.sglang_engine import FleetUnavailable, SGLangEngine
from rstar_jax.rollout.testing.mock_sglang import MockSGLangServer, mock_logprob, mock_next_token
from rstar_jax.rollout.types import GenerateRequest, SamplingParams

FAST = dict(health_interval_s=0.05, health_timeout_s=0.5, max_server_failures=2)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def expected(ids, max_new, shift=0.0, vocab=256):
  hist, out, lps = list(ids), [], []
  while len(out) < max_new:
    t = mock_next_token(hist, vocab)
    lps.append(mock_logprob(hist, t, shift))
    out.append(t)
    hist.append(t)
  return out, lps


class StandInProcess:
  """A stand-in SGLang server in its own process (kill -9 / restart on the same port)."""

  def __init__(self, tmp_path, name, **flags):
    self.port_file = str(tmp_path / f"{name}.port")
    self.flags = flags
    self.proc = None
    self.url = None

  def start(self, port=0):
    if os.path.exists(self.port_file):
      os.remove(self.port_file)
    args = [sys.executable, "-m", "rstar_jax.rollout.testing.mock_sglang"]
    args += ["--port-file", self.port_file, "--port", str(port)]
    for k, v in self.flags.items():
      args += [f"--{k.replace('_', '-')}", str(v)]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    self.proc = subprocess.Popen(args, env=env, stderr=subprocess.DEVNULL)
    return self

  async def ready(self, timeout_s=120):
    for _ in range(int(timeout_s / 0.05)):
      if os.path.exists(self.port_file):
        self.url = open(self.port_file).read().strip()
        return self.url
      assert self.proc.poll() is None, "stand-in process exited"
      await asyncio.sleep(0.05)
    raise TimeoutError("stand-in did not start")

  def kill9(self):
    self.proc.send_signal(signal.SIGKILL)
    self.proc.wait(10)

  def stop(self):
    if self.proc is not None and self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait(10)


async def _running_on(url):
  async with aiohttp.ClientSession() as s:
    async with s.get(url + "/get_load") as r:
      return (await r.json())["num_running_reqs"]


def test_kill_9_mid_turn_regenerates_the_turn_elsewhere_from_its_prefix(tmp_path):
  a = StandInProcess(tmp_path, "a", token_delay_s=0.01, logprob_shift=1.0).start()

  async def main():
    url_a = await a.ready()
    b = await MockSGLangServer().start()
    caps = {url_a: 8192, b.url: 4096}  # the lease goes to A first
    try:
      async with SGLangEngine([url_a, b.url], capacities=caps, **FAST) as eng:
        async with eng.trajectory_lease("t", 2000) as leased:
          assert leased == url_a
          prompt = [3, 1, 4, 1, 5]
          t0 = (await eng.generate([GenerateRequest(prompt, SamplingParams(6), rid="t:0")]))[0]
          tool = [9, 9, 2]  # a tool turn's template ids
          prefix = prompt + t0.output_ids + tool
          turn = asyncio.create_task(
            eng.generate([GenerateRequest(prefix, SamplingParams(400), rid="t:1")])
          )
          while not await _running_on(url_a):  # turn 1 is generating on A
            await asyncio.sleep(0.01)
          a.kill9()
          t1 = (await asyncio.wait_for(turn, 120))[0]
          assert eng.scheduler.server_for("t") == b.url  # re-leased on B
          stats = eng.scheduler.stats()
          assert stats[url_a]["reserved"] == 0 and stats[b.url]["reserved"] == 2000
          return t0, prefix, t1, eng.fleet_metrics(), b.requests
    finally:
      await b.close()

  try:
    t0, prefix, t1, m, b_requests = asyncio.run(main())
  finally:
    a.stop()
  # Turn 0 came from A (its log-probs carry A's shift); turn 1 was generated again on B from
  # the same prefix, every token and log-prob of it B's (none of A's partial output).
  want0, lps0 = expected([3, 1, 4, 1, 5], 6, shift=1.0)
  assert t0.output_ids == want0 and np.allclose(t0.logprobs, lps0)
  want1, lps1 = expected(prefix, 400, shift=0.0)
  assert t1.output_ids == want1 and np.allclose(t1.logprobs, lps1)
  assert [r["input_ids"] for r in b_requests] == [prefix]
  assert m["rollout/failovers"] == 1 and m["rollout/regenerated_turns"] == 1
  assert m["rollout/servers_healthy"] == 1 and m["rollout/servers_total"] == 2


def _two_servers_one_faulty(fault, before_traffic, n_requests=6, max_new=60):
  async def main():
    a = await MockSGLangServer(token_delay_s=0.002, logprob_shift=1.0).start()
    b = await MockSGLangServer(token_delay_s=0.002).start()
    try:
      async with SGLangEngine([a.url, b.url], request_timeout_s=3600, **FAST) as eng:
        reqs = [
          GenerateRequest([7, i], SamplingParams(max_new), rid=f"r{i}:0") for i in range(n_requests)
        ]
        if before_traffic:
          fault(a)
        work = asyncio.create_task(eng.generate(reqs))
        if not before_traffic:
          while not a._running:  # some turns are generating on A
            await asyncio.sleep(0.002)
          fault(a)
        res = await asyncio.wait_for(work, 120)
        return reqs, res, eng.fleet_metrics(), a.events.count("/generate")
    finally:
      a.frozen = False
      await a.close()
      await b.close()

  reqs, res, m, on_a = asyncio.run(main())
  assert on_a >= 1  # turns were sent to A
  for r, got in zip(reqs, res):
    want, lps = expected(r.input_ids, max_new)  # all from B: no shifted log-prob anywhere
    assert got.output_ids == want and np.allclose(got.logprobs, lps), r.rid
  assert m["rollout/failovers"] == 1 and m["rollout/servers_healthy"] == 1
  assert m["rollout/regenerated_turns"] == on_a


def test_a_hung_server_leaves_rotation_and_its_turns_move():
  def hang(server):
    server.frozen = True  # generation and /health stop answering; no request timeout helps

  _two_servers_one_faulty(hang, before_traffic=False)


def test_a_server_answering_5xx_forever_leaves_rotation():
  def break_it(server):
    server.broken_status = 503  # every endpoint, /health included

  _two_servers_one_faulty(break_it, before_traffic=True)


def _tiny_model():
  cfg = qwen3.Qwen3Config(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    max_position_embeddings=128,
  )
  return cfg, qwen3.init_params(cfg, jax.random.PRNGKey(0), dtype=jnp.float32)


def test_a_server_back_with_old_weights_gets_the_current_ones_before_traffic(tmp_path):
  cfg, params = _tiny_model()

  async def main():
    a = await MockSGLangServer(vocab_size=64).start()
    b = await MockSGLangServer(vocab_size=64).start()
    port = int(a.url.rsplit(":", 1)[1])
    eng = SGLangEngine([a.url, b.url], staging_dir=str(tmp_path / "stage"), **FAST)
    try:
      await eng.update_weights(cfg, params, version=7)
      assert a.weight_version == b.weight_version == "7"
      await eng.generate([GenerateRequest([1, 2], SamplingParams(4), rid="w:0")])
      await a.close()  # the server dies ...
      while eng.fleet_metrics()["rollout/servers_healthy"] != 1:
        await asyncio.sleep(0.02)
      a2 = await MockSGLangServer(vocab_size=64, weight_version="0").start(port)  # ... restarts
      while eng.fleet_metrics()["rollout/servers_healthy"] != 2:
        await asyncio.sleep(0.02)
      res = await eng.generate(
        [GenerateRequest([5, i], SamplingParams(4), rid=f"x{i}:0") for i in range(8)]
      )
      return a2, res, eng.fleet_stats
    finally:
      await eng.close()
      await b.close()

  a2, res, stats = asyncio.run(main())
  try:
    assert a2.weight_version == "7" and a2.weight_updates  # refreshed ...
    first_generate = a2.events.index("/generate")  # ... before its first turn
    assert a2.events.index("/update_weights_from_disk") < first_generate
    assert {r.weight_version for r in res} == {7}
    assert stats["rejoins"] == 1 and stats["failovers"] == 1
  finally:
    asyncio.run(a2.close())


def test_every_server_gone_past_server_timeout_is_a_checkpointed_stop():
  async def main():
    a = await MockSGLangServer().start()
    eng = SGLangEngine([a.url], server_timeout_s=0.3, **FAST)
    try:
      await eng.generate([GenerateRequest([1], SamplingParams(2), rid="q:0")])
      await a.close()
      with pytest.raises(FleetUnavailable) as e:
        await asyncio.wait_for(
          eng.generate([GenerateRequest([1], SamplingParams(2), rid="q:1")]), 60
        )
      with pytest.raises(FleetUnavailable):  # a lease waiting for capacity fails too
        async with eng.trajectory_lease("z", 10):
          pass
      return e.value
    finally:
      await eng.close()

  err = asyncio.run(main())
  assert isinstance(err, CheckpointedStop) and err.exit_code == 75
  msg = str(err)
  assert "\n" not in msg and "rollout.server_timeout_s" in msg and "0.3s" in msg
