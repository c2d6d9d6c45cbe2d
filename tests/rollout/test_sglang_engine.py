"""SGLangEngine against the in-test mock SGLang server (127.0.0.1)."""

import asyncio
import os

import numpy as np
import pytest

from rstar_jax.rollout.sglang_engine import (
  SGLangEngine,
  SGLangError,
  parse_generate_response,
  sampling_to_sglang,
)
from rstar_jax.rollout.testing.mock_sglang import MockSGLangServer, mock_logprob, mock_next_token
from rstar_jax.rollout.types import GenerateRequest, SamplingParams


def expected(ids, max_new, stops, vocab=256):
  hist, out, lps = list(ids), [], []
  while len(out) < max_new:
    t = mock_next_token(hist, vocab)
    lps.append(mock_logprob(hist, t))
    out.append(t)
    hist.append(t)
    if t in stops:
      return out, lps, "stop"
  return out, lps, "length"


async def _with_servers(n, fn, **kw):
  servers = [await MockSGLangServer(**kw).start() for _ in range(n)]
  try:
    return await fn(servers)
  finally:
    for s in servers:
      await s.close()


def test_generate_maps_fields_and_parses_results():
  async def fn(servers):
    async with SGLangEngine([servers[0].url], max_retries=0) as eng:
      ids = [5, 9, 11]
      out0, _, _ = expected(ids, 40, ())
      stop = out0[6]
      reqs = [
        GenerateRequest(
          ids, SamplingParams(40, temperature=0.7, seed=3, stop_token_ids=(stop,)), rid="a:0"
        ),
        GenerateRequest([1, 2], SamplingParams(5), rid="b:0"),
      ]
      res = await eng.generate(reqs)
      body = servers[0].requests[0]
      return res, body, stop, ids

  res, body, stop, ids = asyncio.run(_with_servers(1, fn))
  want, lps, reason = expected(ids, 40, (stop,))
  assert res[0].output_ids == want and reason == "stop" and res[0].finish_reason == "stop"
  assert res[0].output_ids[-1] == stop
  np.testing.assert_allclose(res[0].logprobs, lps)
  want1, _, _ = expected([1, 2], 5, ())
  assert res[1].output_ids == want1 and res[1].finish_reason == "length"
  assert res[0].prefill_tokens == 3 and res[1].prefill_tokens == 2  # mock: cached_tokens 0
  assert body["input_ids"] == ids and body["rid"] == "a:0" and body["return_logprob"] is True
  sp = body["sampling_params"]
  assert (
    sp["max_new_tokens"],
    sp["temperature"],
    sp["top_k"],
    sp["sampling_seed"],
    sp["stop_token_ids"],
  ) == (40, 0.7, -1, 3, [stop])


def test_prefill_tokens_are_prompt_minus_radix_cache_hits():
  def body(**meta):
    return {"output_ids": [7], "meta_info": {"finish_reason": {"type": "length"}, **meta}}

  assert parse_generate_response(body(prompt_tokens=120, cached_tokens=100), 0).prefill_tokens == 20
  assert parse_generate_response(body(prompt_tokens=5), 0).prefill_tokens is None  # unknown
  assert parse_generate_response(body(), 0).prefill_tokens is None


def test_retries_500_then_gives_up_with_clear_error():
  async def fn(servers):
    s = servers[0]
    async with SGLangEngine([s.url], max_retries=2, backoff_s=0.01) as eng:
      s.fail_next("/generate", 2)
      r = await eng.generate([GenerateRequest([1], SamplingParams(3))])
      assert eng.retries == 2 and len(r[0].output_ids) == 3
      s.fail_next("/generate", 3)
      with pytest.raises(SGLangError, match=r"/generate: failed after 3 attempts.*HTTP 500"):
        await eng.generate([GenerateRequest([1], SamplingParams(3))])
      s.fail_next("/generate", 1, status=400)
      n = len(s.requests)
      with pytest.raises(SGLangError, match="HTTP 400"):  # 4xx is not retried
        await eng.generate([GenerateRequest([1], SamplingParams(3))])
      assert eng.retries == 4 and len(s.requests) == n

  asyncio.run(_with_servers(1, fn))


def test_timeout_aborts_on_worker_and_retries():
  async def fn(servers):
    s = servers[0]
    async with SGLangEngine([s.url], max_retries=1, backoff_s=0.0, request_timeout_s=0.5) as eng:
      s.hang_next_generate(1)
      r = await eng.generate([GenerateRequest([4, 4], SamplingParams(6), rid="t7:0")])
      assert r[0].finish_reason == "length" and len(r[0].output_ids) == 6
      assert s.aborted == ["t7:0"]

  asyncio.run(_with_servers(1, fn))


def test_abort_goes_to_the_worker_holding_the_rid():
  async def fn(servers):
    async with SGLangEngine([s.url for s in servers], max_retries=0) as eng:
      slow = asyncio.create_task(
        eng.generate([GenerateRequest([3], SamplingParams(10_000), rid="long:0")])
      )
      # Abort once the holder has produced a token (the mock runs in this event loop),
      # so the result is a partial output whatever the machine's speed.
      while not any(st["tokens"] > 1 for s in servers for st in s._running.values()):
        await asyncio.sleep(0.005)
      holder = next(s for s in servers if s.requests)
      assert await eng.abort("long:0")
      res = (await slow)[0]
      assert not await eng.abort("long:0")  # no longer in flight
      other = next(s for s in servers if s is not holder)
      return res, holder.aborted, other.aborted

  res, held, other = asyncio.run(_with_servers(2, fn, token_delay_s=0.002))
  assert res.finish_reason == "abort" and 0 < len(res.output_ids) < 10_000
  assert held == ["long:0"] and other == []


def test_sticky_routing_and_health():
  async def fn(servers):
    async with SGLangEngine([s.url for s in servers]) as eng:
      await asyncio.gather(
        *[
          eng.generate([GenerateRequest([i], SamplingParams(2), rid=f"traj{i}:0")])
          for i in range(6)
        ]
      )
      for turn in (1, 2):
        await asyncio.gather(
          *[
            eng.generate([GenerateRequest([i], SamplingParams(2), rid=f"traj{i}:{turn}")])
            for i in range(6)
          ]
        )
      where = {}
      for k, s in enumerate(servers):
        for b in s.requests:
          where.setdefault(b["rid"].split(":")[0], set()).add(k)
      servers[1].healthy = False
      return where, await eng.health()

  where, health = asyncio.run(_with_servers(2, fn))
  assert all(len(v) == 1 for v in where.values()) and len(where) == 6
  assert {next(iter(v)) for v in where.values()} == {0, 1}  # both servers used
  assert list(health.values()) == [True, False]


def _tiny_model():
  import jax

  from rstar_jax.models import qwen3

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


def test_update_weights_pushes_loadable_dir(tmp_path):
  import torch
  from transformers import AutoModelForCausalLM

  from rstar_jax.models import qwen3

  cfg, params = _tiny_model()

  async def fn(servers):
    async with SGLangEngine(
      [s.url for s in servers], staging_dir=str(tmp_path), keep_versions=1, backoff_s=0.01
    ) as eng:
      servers[0].fail_next("/update_weights_from_disk", 1)  # a 500 is retried
      await eng.update_weights(cfg, params, 5)
      assert eng.weight_version == 5
      r = await eng.generate([GenerateRequest([1], SamplingParams(2))])
      assert r[0].weight_version == 5
      loaded = [dict(s.loaded) for s in servers]
      path = servers[0].model_path
      await eng.update_weights(cfg, params)  # version 6; version_5 is cleaned up
      assert eng.weight_version == 6 and not os.path.exists(path)
      assert all(s.weight_version == "6" for s in servers)
      servers[1].fail_next("/update_weights_from_disk", 1, status=400)
      with pytest.raises(SGLangError, match="HTTP 400"):
        await eng.update_weights(cfg, params)
      return loaded, servers[0].model_path

  loaded, path6 = asyncio.run(_with_servers(2, fn))
  hf = AutoModelForCausalLM.from_pretrained(path6, local_files_only=True).eval()
  sd = {k: v.numpy() for k, v in hf.state_dict().items()}
  for tensors in loaded:
    assert set(tensors) == set(sd)
    for k, v in tensors.items():
      np.testing.assert_array_equal(v, sd[k])
  back = qwen3.load_hf_params(path6, cfg)
  import jax

  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(back)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  ids = np.array([[1, 5, 9, 3]])
  with torch.no_grad():
    ref = hf(torch.tensor(ids)).logits.numpy()
  np.testing.assert_allclose(np.asarray(qwen3.forward(params, cfg, ids)), ref, atol=1e-4)


def test_sampling_mapping_rejects_id_stops():
  with pytest.raises(ValueError, match="token ids"):
    sampling_to_sglang(SamplingParams(4, stop=((1, 2),)))
  assert sampling_to_sglang(SamplingParams(4, stop=("</tool_call>",)))["stop"] == ["</tool_call>"]
  assert "sampling_seed" not in sampling_to_sglang(SamplingParams(4))


def _free_port() -> int:
  import socket

  with socket.socket() as s:  # bound and closed: nothing listens there afterwards
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_wait_healthy_times_out_with_progress_and_one_line(caplog):
  """Servers that never answer: progress lines while waiting, then one line naming the URL
  after rollout.server_timeout_s (before: a silent 600 s wait with no setting)."""
  import logging
  import time

  from rstar_jax.errors import UserError

  url = f"http://127.0.0.1:{_free_port()}"
  eng = SGLangEngine([url], server_timeout_s=1.2)

  async def go():
    try:
      await eng.wait_healthy(poll_s=0.1, log_every_s=0.4)
    finally:
      await eng.close()

  t0 = time.monotonic()
  with caplog.at_level(logging.INFO), pytest.raises(UserError) as e:
    asyncio.run(go())
  assert 1.2 <= time.monotonic() - t0 < 8
  msg = str(e.value)
  assert "\n" not in msg and url in msg and "rollout.server_timeout_s" in msg
  waiting = [r.getMessage() for r in caplog.records if "waiting for 1 of 1" in r.getMessage()]
  assert len(waiting) >= 2 and url in waiting[0]


def test_wait_healthy_fails_at_once_on_an_unresolvable_host(monkeypatch):
  import socket
  import time

  from rstar_jax.rollout.sglang_engine import ServersUnavailable

  # The resolver's answer for a typo'd host, without a DNS query leaving the machine.
  real = socket.getaddrinfo

  def getaddrinfo(host, *a, **k):
    if host == "rstar-no-such-host.invalid":
      raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return real(host, *a, **k)

  monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
  url = "http://rstar-no-such-host.invalid:30000"
  eng = SGLangEngine([url], server_timeout_s=300)

  async def go():
    try:
      await eng.wait_healthy()
    finally:
      await eng.close()

  t0 = time.monotonic()
  with pytest.raises(
    ServersUnavailable, match=r"cannot resolve host 'rstar-no-such-host\.invalid'"
  ):
    asyncio.run(go())
  assert time.monotonic() - t0 < 10


def test_wait_healthy_ctrl_c_is_one_line():
  """A cancellation (what asyncio.run does on Ctrl-C) while waiting is one error naming the
  servers waited for, not a chain of tracebacks."""
  from rstar_jax.rollout.sglang_engine import ServersUnavailable

  url = f"http://127.0.0.1:{_free_port()}"
  eng = SGLangEngine([url], server_timeout_s=300)

  async def go():
    task = asyncio.ensure_future(eng.wait_healthy(poll_s=0.05))
    await asyncio.sleep(0.3)
    task.cancel()
    try:
      return await task
    finally:
      await eng.close()

  with pytest.raises(ServersUnavailable, match=rf"interrupted .* waiting for SGLang .*{url}"):
    asyncio.run(go())


def test_server_timeout_is_a_setting():
  from rstar_jax.config import RolloutConfig
  from rstar_jax.pipelines.wiring import build_engine

  assert RolloutConfig().server_timeout_s == 600.0
  from rstar_jax.config import RunConfig

  run = RunConfig(rollout=RolloutConfig(engine="sglang", server_timeout_s=7.0))
  eng = build_engine(run, None, None, None)
  assert eng.server_timeout_s == 7.0
