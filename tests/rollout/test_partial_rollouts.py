"""Partial rollouts at a weight push (rollout/interruptible.py) on both engines: the embedded
JaxSampler (weights swapped between decode chunks) and SGLang through the mock server
(pause_generation(abort) -> update -> continue_generation, remainder resubmitted)."""

import asyncio

import jax
import pytest

from rstar_jax.models import qwen3
from rstar_jax.rollout.interruptible import CURRENT_TICKET, InterruptibleEngine, RolloutTicket
from rstar_jax.rollout.jax_sampler import JaxSampler
from rstar_jax.rollout.sglang_engine import SGLangEngine
from rstar_jax.rollout.testing.mock_sglang import MockSGLangServer
from rstar_jax.rollout.types import GenerateRequest, SamplingParams


@pytest.fixture(scope="module")
def tiny():
  cfg = qwen3.Qwen3Config(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    max_position_embeddings=128,
  )
  return cfg, qwen3.init_params(cfg, jax.random.PRNGKey(0))


def _req(rid, n=40, prompt=(3, 5, 7, 9)):
  return GenerateRequest(list(prompt), SamplingParams(n, temperature=0.0), rid=rid)


async def _ticketed(engine, req):
  ticket = RolloutTicket()
  token = CURRENT_TICKET.set(ticket)
  try:
    return (await engine.generate([req]))[0], ticket
  finally:
    CURRENT_TICKET.reset(token)


def test_bad_mode_is_rejected(tiny):
  cfg, params = tiny
  with pytest.raises(ValueError, match="mode: expected one of"):
    InterruptibleEngine(JaxSampler(cfg, params), "pause")


# ----------------------------------------------------------------------------- JaxSampler


def _sampler(tiny):
  cfg, params = tiny
  return JaxSampler(cfg, params, max_batch=4, max_len=64, prefill_buckets=(8,), decode_chunk=2)


async def _when_decoding(sampler):
  while not any(r is not None and r.output_ids for r in sampler._rows):
    await asyncio.sleep(0.001)


def test_jax_continue_keeps_each_tokens_version(tiny):
  cfg, params = tiny
  sampler = _sampler(tiny)
  eng = InterruptibleEngine(sampler, "continue")
  new_params = jax.tree.map(lambda x: x * 1.5, params)

  async def main():
    task = asyncio.create_task(_ticketed(eng, _req("t0:0")))
    await _when_decoding(sampler)
    await eng.update_weights(cfg, new_params, 1)
    res, ticket = await task
    ref = (await sampler.generate([_req("ref:0")]))[0]  # uninterrupted, new weights
    return res, ticket, ref

  res, ticket, ref = asyncio.run(main())
  vs = res.token_versions()
  assert res.finish_reason == "length" and len(res.output_ids) == 40
  assert vs[0] == 0 and vs[-1] == 1 and vs == sorted(vs)  # old prefix, new suffix
  assert res.weight_version == 0 and not ticket.restarted
  assert eng.version_history == [0, 1] and eng.lag(0) == 1 and eng.lag(1) == 0
  # The tail really came from the new weights: the same request on them alone differs.
  assert res.output_ids != ref.output_ids and ref.token_versions() == [1] * 40
  assert res.prefill_tokens == 4  # weights swapped between chunks: nothing re-prefilled


def test_jax_restart_aborts_ticketed_requests_only(tiny):
  cfg, params = tiny
  sampler = _sampler(tiny)
  eng = InterruptibleEngine(sampler, "restart")

  async def main():
    traj = asyncio.create_task(_ticketed(eng, _req("t1:0")))
    plain = asyncio.create_task(eng.generate([_req("eval:0", prompt=(4, 6, 8))]))
    await _when_decoding(sampler)
    await eng.update_weights(cfg, params, 1)
    (res, ticket), (other,) = await traj, await plain
    # A trajectory that first generated before the push and comes back afterwards (it was in
    # a tool call) is restarted at its next request.
    waiting = RolloutTicket(epoch=0)
    token = CURRENT_TICKET.set(waiting)
    try:
      late = (await eng.generate([_req("t2:1", n=4)]))[0]
    finally:
      CURRENT_TICKET.reset(token)
    return res, ticket, other, late, waiting

  res, ticket, other, late, waiting = asyncio.run(main())
  assert res.finish_reason == "abort" and ticket.restarted and len(res.output_ids) < 40
  assert other.finish_reason == "length" and len(other.output_ids) == 40
  assert set(other.token_versions()) == {0, 1}  # no ticket: continued
  assert late.finish_reason == "abort" and late.output_ids == [] and waiting.restarted
  assert eng.stats["restarted_trajectories"] == 2


# ----------------------------------------------------------------------------- SGLang (mock)


async def _with_mock(fn, tmp_path, mode):
  async with MockSGLangServer(vocab_size=64, token_delay_s=0.004) as server:
    eng = InterruptibleEngine(
      SGLangEngine([server.url], staging_dir=str(tmp_path), capacities={server.url: 4096}), mode
    )
    try:
      return await fn(server, eng)
    finally:
      await eng.close()


def test_sglang_continue_pauses_loads_and_resubmits_the_remainder(tiny, tmp_path):
  cfg, params = tiny

  async def fn(server, eng):
    ref = (await eng.inner.generate([_req("ref:0", n=30)]))[0]
    task = asyncio.create_task(_ticketed(eng, _req("t0:0", n=30)))
    while not any(s["tokens"] > 6 for s in server._running.values()):
      await asyncio.sleep(0.002)
    await eng.update_weights(cfg, params, 1)
    res, ticket = await task
    return ref, res, ticket, server, dict(eng.stats)

  ref, res, ticket, server, stats = asyncio.run(_with_mock(fn, tmp_path, "continue"))
  assert server.pause_calls == 1 and server.paused_mode is None  # paused, then continued
  assert str(server.weight_version) == "1" and len(server.weight_updates) == 1
  # The mock model is a function of the token history, so prompt + partial resubmitted gives
  # exactly the uninterrupted output; versions say which part came from which weights.
  assert res.output_ids == ref.output_ids and res.logprobs == ref.logprobs
  assert res.finish_reason == "length" and not ticket.restarted
  vs = res.token_versions()
  assert vs[0] == 0 and vs[-1] == 1 and vs == sorted(vs) and res.weight_version == 0
  second = server.requests[-1]
  assert second["input_ids"][:4] == [3, 5, 7, 9] and len(second["input_ids"]) == 4 + vs.count(0)
  assert second["sampling_params"]["max_new_tokens"] == 30 - vs.count(0)
  assert stats["interrupted_requests"] == 1 and stats["resubmitted_requests"] == 1
  # The mock reports cached_tokens=0, so both submissions' inputs count as prefilled.
  assert res.prefill_tokens == 4 + len(second["input_ids"])


def test_sglang_restart_returns_abort_and_new_requests_wait_for_continue(tiny, tmp_path):
  cfg, params = tiny

  async def fn(server, eng):
    task = asyncio.create_task(_ticketed(eng, _req("t0:0", n=30)))
    while not server._running:
      await asyncio.sleep(0.002)
    push = asyncio.create_task(eng.update_weights(cfg, params, 1))
    while server.paused_mode is None and not push.done():
      await asyncio.sleep(0.001)
    # Issued while the push is under way: it waits and runs on the new weights only.
    fresh = asyncio.create_task(eng.generate([_req("e:0", n=5)]))
    await push
    (res, ticket), (after,) = await task, await fresh
    return res, ticket, after, server

  res, ticket, after, server = asyncio.run(_with_mock(fn, tmp_path, "restart"))
  assert res.finish_reason == "abort" and ticket.restarted
  assert after.finish_reason == "length" and after.token_versions() == [1] * 5
  assert server.pause_calls == 1 and server.paused_mode is None
