"""SGLang routed experts (routing replay): the request field, the base64 int32 response and its
decoding, round-tripped through the stand-in server (127.0.0.1), and through the agent loop."""

import asyncio
import base64

import jax
import numpy as np
import pytest

from rstar_jax.models.routes import NO_ROUTE, RouteLayout
from rstar_jax.rollout import sglang_routes
from rstar_jax.rollout.sglang_engine import SGLangEngine, SGLangError
from rstar_jax.rollout.testing.mock_sglang import MockSGLangServer, mock_next_token, mock_routes
from rstar_jax.rollout.types import GenerateRequest, SamplingParams

# 3 hidden layers, the middle one dense (mlp_only_layers=[1]); top 2 of 8 experts.
LAYOUT = RouteLayout(num_hidden_layers=3, top_k=2, layers=(0, 2))
SERVER = (3, 2, 8)


def test_encoding_is_base64_of_little_endian_int32_in_c_order():
  arr = np.arange(2 * 3 * 2, dtype=np.int32).reshape(2, 3, 2)
  s = sglang_routes.encode_routed_experts(arr)
  raw = base64.b64decode(s)
  assert raw == arr.astype("<i4").tobytes() and len(raw) == arr.size * 4
  got = sglang_routes.decode_routed_experts(s, 2, LAYOUT)
  want = arr.copy()
  want[:, 1] = NO_ROUTE  # the dense layer's row (SGLang never writes it)
  np.testing.assert_array_equal(got, want)
  with pytest.raises(ValueError, match="has 48 bytes, expected 72"):
    sglang_routes.decode_routed_experts(s, 3, LAYOUT)
  with pytest.raises(ValueError, match="not base64"):
    sglang_routes.decode_routed_experts("%%%", 1, LAYOUT)


async def _serve(fn, **kw):
  server = await MockSGLangServer(**kw).start()
  try:
    return await fn(server)
  finally:
    await server.close()


def test_engine_asks_for_routes_and_decodes_them():
  async def fn(server):
    async with SGLangEngine([server.url], max_retries=0, route_layout=LAYOUT) as eng:
      (res,) = await eng.generate([GenerateRequest([5, 9, 11], SamplingParams(6), rid="a:0")])
    return res, server.requests[0]

  res, body = asyncio.run(_serve(fn, routed_experts=SERVER))
  assert body[sglang_routes.REQUEST_FIELD] is True
  seq = [5, 9, 11] + res.output_ids
  assert res.routes_start == 0 and res.routes.shape == (len(seq) - 1, 3, 2)
  np.testing.assert_array_equal(res.routes, LAYOUT.dense_rows_cleared(mock_routes(seq, *SERVER)))
  assert (res.routes[:, [0, 2]] >= 0).all() and (res.routes[:, 1] == NO_ROUTE).all()


def test_no_routes_asked_without_a_layout_and_a_clear_error_without_the_server_flag():
  async def plain(server):
    async with SGLangEngine([server.url], max_retries=0) as eng:
      (res,) = await eng.generate([GenerateRequest([5, 9], SamplingParams(3))])
    return res, server.requests[0]

  res, body = asyncio.run(_serve(plain, routed_experts=SERVER))
  assert sglang_routes.REQUEST_FIELD not in body and res.routes is None

  async def unflagged(server):
    async with SGLangEngine([server.url], max_retries=0, route_layout=LAYOUT) as eng:
      await eng.generate([GenerateRequest([5, 9], SamplingParams(3))])

  with pytest.raises(SGLangError, match="--enable-return-routed-experts"):
    asyncio.run(_serve(unflagged))


def test_multi_turn_trajectory_routes_from_the_server(tokenizer, monkeypatch):
  """Agent loop over the stand-in server: every position but the last, prompt and tool turns
  included, carries the server's route of that token."""
  from rollout_helpers import FakePool

  from rstar_jax.rollout import agent_loop
  from rstar_jax.rollout.agent_loop import RolloutSettings, run_trajectory
  from rstar_jax.tokenization import chat_format

  vocab = len(tokenizer)
  # The mock's tokens are noise: its first turn is read as one tool call, so a tool turn
  # follows and the second request re-sends it.
  calls = iter([[chat_format.ToolCall("python", {"code": "print(2+2)"})]])
  monkeypatch.setattr(agent_loop.chat_format, "parse_tool_calls", lambda *a: next(calls, []))

  # Stop the first turn on its 5th token (the mock model is a known function of the ids).
  hist = chat_format.prompt_ids(tokenizer, "rstar2", "What is 2+2?")
  for _ in range(5):
    hist.append(mock_next_token(hist, vocab))

  async def fn(server):
    async with SGLangEngine([server.url], max_retries=0, route_layout=LAYOUT) as eng:
      cfg = RolloutSettings(response_budget=80, max_turns=2, stop_token_ids=(hist[-1],))
      return await run_trajectory(eng, tokenizer, FakePool(), "What is 2+2?", cfg)

  t = asyncio.run(_serve(fn, routed_experts=SERVER, vocab_size=vocab))
  assert t.num_turns == 2 and 0 in t.loss_mask
  seq = t.prompt_ids + t.response_ids
  assert t.routes.shape == (len(seq), 3, 2)
  np.testing.assert_array_equal(t.routes[:-1], LAYOUT.dense_rows_cleared(mock_routes(seq, *SERVER)))
  assert (t.routes[-1] == NO_ROUTE).all()


def test_interrupted_request_keeps_one_route_per_position(tmp_path):
  """A weight push mid-request (partial rollouts, "continue"): the remainder is resubmitted
  and the merged result's routes are those of the whole sequence, as if uninterrupted."""
  from rstar_jax.models import qwen3
  from rstar_jax.rollout.interruptible import CURRENT_TICKET, InterruptibleEngine, RolloutTicket

  cfg = qwen3.Qwen3Config(
    vocab_size=64, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
    num_attention_heads=1, num_key_value_heads=1,
  )  # fmt: skip
  req = GenerateRequest([3, 5, 7, 9], SamplingParams(30, temperature=0.0), rid="t0:0")

  async def fn(server):
    inner = SGLangEngine(
      [server.url], staging_dir=str(tmp_path), capacities={server.url: 4096}, route_layout=LAYOUT
    )
    eng = InterruptibleEngine(inner, "continue")
    try:
      token = CURRENT_TICKET.set(RolloutTicket())
      task = asyncio.create_task(eng.generate([req]))
      CURRENT_TICKET.reset(token)
      while not any(s["tokens"] > 6 for s in server._running.values()):
        await asyncio.sleep(0.002)
      await eng.update_weights(cfg, qwen3.init_params(cfg, jax.random.key(0)), 1)
      (res,) = await task
      return res, dict(eng.stats)
    finally:
      await eng.close()

  res, stats = asyncio.run(_serve(fn, routed_experts=SERVER, vocab_size=64, token_delay_s=0.004))
  assert stats["resubmitted_requests"] == 1 and len(res.output_ids) == 30
  seq = list(req.input_ids) + res.output_ids
  assert res.routes_start == 0 and len(res.routes) == len(seq)
  np.testing.assert_array_equal(
    res.routes[:-1], LAYOUT.dense_rows_cleared(mock_routes(seq, *SERVER))
  )
  assert (res.routes[-1] == NO_ROUTE).all()


def test_config_decides_whether_engines_ask_for_routes():
  """rl.routing_replay / rl.routing_metrics on an MoE policy make build_engine ask for routes
  (SGLang: the layout of the model's MoE layers); off, or a dense model, asks for none; a bad
  value is a one-line config error."""
  from rstar_jax.config import ConfigError, RLConfig, RolloutConfig, RunConfig
  from rstar_jax.models.qwen3_config import Qwen3MoeConfig
  from rstar_jax.pipelines.wiring import build_engine

  moe_cfg = Qwen3MoeConfig(
    vocab_size=64, hidden_size=8, intermediate_size=8, moe_intermediate_size=4,
    num_hidden_layers=3, num_attention_heads=1, num_key_value_heads=1, num_experts=4,
    num_experts_per_tok=2, mlp_only_layers=(1,),
  )  # fmt: skip

  def layout(model, **rl):
    run = RunConfig(rollout=RolloutConfig(engine="sglang"), rl=RLConfig(**rl))
    return build_engine(run, model, None, None).route_layout

  assert layout(moe_cfg, routing_replay="rollout") == LAYOUT
  assert layout(moe_cfg, routing_metrics=True) == LAYOUT
  assert layout(moe_cfg) is None
  dense = qwen3_dense_config()
  assert layout(dense, routing_replay="rollout") is None
  assert RunConfig(rl=RLConfig(routing_replay="rollout")).step_config().routing_replay
  with pytest.raises(
    ConfigError, match=r"rl\.routing_replay: expected one of \['off', 'rollout'\]"
  ):
    RLConfig(routing_replay="engine")


def qwen3_dense_config():
  from rstar_jax.models import qwen3

  return qwen3.Qwen3Config(
    vocab_size=64, hidden_size=8, intermediate_size=8, num_hidden_layers=3,
    num_attention_heads=1, num_key_value_heads=1,
  )  # fmt: skip
