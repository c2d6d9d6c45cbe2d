import asyncio
import dataclasses

import pytest
from rollout_helpers import FakePool, ScriptedEngine, call_text

from rstar_jax.pipelines import rl_metrics
from rstar_jax.rewards import quality
from rstar_jax.rollout.agent_loop import RolloutSettings, run_agent_loop, run_trajectory
from rstar_jax.tokenization import chat_format as cf

FINAL = "so 4.</reason><answer>\\boxed{4}</answer>"


def _run(engine, tok, pool, cfg, q="What is 2+2?", **kw):
  return asyncio.run(run_trajectory(engine, tok, pool, q, cfg, **kw))


def _turns(*texts):
  return lambda req, turn: texts[min(turn, len(texts) - 1)]


def test_single_turn_stop(tokenizer):
  eng = ScriptedEngine(tokenizer, _turns(FINAL))
  t = _run(eng, tokenizer, FakePool(), RolloutSettings(response_budget=200))
  ids = tokenizer.encode(FINAL, add_special_tokens=False) + [cf.stop_token_id(tokenizer)]
  assert t.response_ids == ids and t.loss_mask == [1] * len(ids)
  assert t.logprobs == [-0.5] * len(ids) and t.weight_versions == [3] * len(ids)
  assert (t.finish_reason, t.num_turns, t.tool_calls, t.num_answer_tags) == ("stop", 1, [], 1)
  assert t.prompt_ids == cf.prompt_ids(tokenizer, "rstar2", "What is 2+2?")
  assert t.response_text == FINAL + "<|im_end|>"
  assert eng.requests[0].sampling.max_new_tokens == 200
  assert eng.requests[0].sampling.stop_token_ids == (cf.stop_token_id(tokenizer),)


def test_tool_turn_masks_and_token_in_token_out(tokenizer):
  eng = ScriptedEngine(tokenizer, _turns(call_text("print(2+2)"), FINAL))
  pool = FakePool()
  t = _run(
    eng, tokenizer, pool, RolloutSettings(response_budget=400), render=lambda r, n: r.stdout.strip()
  )
  assert t.finish_reason == "stop" and t.num_turns == 2
  assert [(c.status, c.code, c.output_text, c.turn) for c in t.tool_calls] == [
    ("ok", "print(2+2)", "4", 0)
  ]
  assert pool.calls == [("print(2+2)", "", 4.0, None)]
  # the second request is exactly prompt + everything so far (no re-encoding)
  second = eng.requests[1]
  assert (
    list(second.input_ids)
    == t.prompt_ids + t.response_ids[: len(second.input_ids) - len(t.prompt_ids)]
  )
  # token-for-token equal to the SFT renderer of the same conversation
  msgs = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": call_text("print(2+2)")},
    {"role": "tool", "content": "4"},
    {"role": "assistant", "content": FINAL},
  ]
  r = cf.render_chat_ids(tokenizer, msgs)
  assert (r.prompt_ids, r.response_ids, r.loss_mask) == (t.prompt_ids, t.response_ids, t.loss_mask)
  zero = [i for i, m in enumerate(t.loss_mask) if m == 0]
  assert zero and all(t.logprobs[i] == 0.0 for i in zero)
  assert second.sampling.max_new_tokens == 400 - len(second.input_ids) + len(t.prompt_ids)


def test_parse_error_and_tool_failure_go_back_to_model(tokenizer):
  bad = 'oops<tool_call>{"name": broken</tool_call>'
  eng = ScriptedEngine(tokenizer, _turns(bad, call_text("print(1+1)"), FINAL))
  t = _run(eng, tokenizer, FakePool(status="timeout"), RolloutSettings(response_budget=600))
  assert [c.status for c in t.tool_calls] == ["parse_error", "timeout"]
  assert t.tool_calls[0].output_text.startswith("Failed to decode tool call: ")
  assert "Failed to decode tool call" in t.response_text
  assert "Tool call failure" in t.tool_calls[1].output_text
  assert t.finish_reason == "stop" and t.num_turns == 3


def test_pool_exception_ends_trajectory(tokenizer):
  eng = ScriptedEngine(tokenizer, _turns(call_text("print(1+1)"), FINAL))
  t = _run(
    eng,
    tokenizer,
    FakePool(raise_exc=RuntimeError("pool down")),
    RolloutSettings(response_budget=600),
  )
  assert t.finish_reason == "tool_error" and t.num_turns == 1
  assert t.tool_calls[0].status == "internal_error" and "pool down" in t.tool_calls[0].output_text
  assert t.response_ids[-1] == cf.stop_token_id(tokenizer)


def test_max_turns_ends_on_assistant_turn(tokenizer):
  eng = ScriptedEngine(tokenizer, _turns(call_text("print(1+1)")))
  t = _run(eng, tokenizer, FakePool(), RolloutSettings(max_turns=3, response_budget=5000))
  assert (t.finish_reason, t.num_turns, len(t.tool_calls)) == ("max_turns", 3, 2)
  assert t.response_ids[-1] == cf.stop_token_id(tokenizer) and t.loss_mask[-1] == 1


def test_budget_counts_tool_tokens_and_never_overflows(tokenizer):
  call = call_text("print(1+1)")
  turn_len = len(tokenizer.encode(call, add_special_tokens=False)) + 1
  tool_len = len(cf.tool_turn_ids(tokenizer, "rstar2", "2"))
  render = lambda r, n: r.stdout.strip()  # noqa: E731
  # room for exactly: turn, tool turn, turn -> the second tool turn would overflow
  budget = 2 * turn_len + tool_len + 3
  eng = ScriptedEngine(tokenizer, _turns(call))
  t = _run(eng, tokenizer, FakePool(), RolloutSettings(response_budget=budget), render=render)
  assert t.finish_reason == "tool_overflow" and t.num_turns == 2
  assert len(t.response_ids) == 2 * turn_len + tool_len <= budget
  assert [r.sampling.max_new_tokens for r in eng.requests] == [budget, budget - turn_len - tool_len]
  # a turn cut by the budget ends the trajectory with "length"
  eng = ScriptedEngine(tokenizer, _turns(call))
  t = _run(
    eng,
    tokenizer,
    FakePool(),
    RolloutSettings(response_budget=turn_len + tool_len + 4),
    render=render,
  )
  assert t.finish_reason == "length" and len(t.response_ids) == turn_len + tool_len + 4
  assert t.num_turns == 2 and t.loss_mask[-4:] == [1] * 4


def test_parallel_calls_and_tool_call_budget(tokenizer):
  three = "x" + "".join(cf.format_tool_call(f"print({i}+1)") for i in range(3))
  for cap, want in [(0, 3), (1, 1), (2, 2)]:
    pool = FakePool()
    eng = ScriptedEngine(tokenizer, _turns(three, FINAL))
    t = _run(eng, tokenizer, pool, RolloutSettings(response_budget=2000, max_parallel_calls=cap))
    assert len(pool.calls) == want and len(t.tool_calls) == want
    assert t.response_text.count("<tool_response>") == want
  pool = FakePool()
  eng = ScriptedEngine(tokenizer, _turns(three))
  t = _run(eng, tokenizer, pool, RolloutSettings(response_budget=5000, max_tool_calls=4))
  assert len(pool.calls) == 4 and t.finish_reason == "max_tool_calls" and t.num_turns == 3


def test_no_per_turn_barrier(tokenizer):
  """A trajectory whose tool call is slow must not hold back another one's next turns."""

  class SlowFirst(FakePool):
    async def execute(self, code, stdin="", timeout_s=None, session_id=None):
      self.delay_s = 0.3 if code == "print(9+9)" else 0.0
      return await super().execute(code, stdin, timeout_s, session_id)

  def script(req, turn):
    slow = "slow one" in tokenizer.decode(req.input_ids)
    return FINAL if turn >= 3 else call_text("print(9+9)" if slow else "print(1+1)")

  eng = ScriptedEngine(tokenizer, script, delay_s=0.001)
  cfg = RolloutSettings(response_budget=3000)
  trajs = asyncio.run(run_agent_loop(eng, tokenizer, SlowFirst(), ["slow one", "fast one"], 1, cfg))
  slow_id = next(r.rid for r in eng.requests if "slow" in tokenizer.decode(r.input_ids)).split(":")[
    0
  ]
  ends = [rid for kind, rid in eng.events if kind == "end"]
  fast_last = max(i for i, rid in enumerate(ends) if not rid.startswith(slow_id))
  slow_second = ends.index(slow_id + ":1")
  assert fast_last < slow_second  # the fast trajectory finished all 4 turns meanwhile
  assert [t.num_turns for t in trajs] == [4, 4]


def test_run_agent_loop_order_progress_and_seeds(tokenizer):
  seen = []
  eng = ScriptedEngine(tokenizer, _turns(call_text("print(1+2)"), FINAL))
  cfg = RolloutSettings(response_budget=600, seed=7, stateful_tool=True)
  pool = FakePool()
  trajs = asyncio.run(
    run_agent_loop(
      eng,
      tokenizer,
      pool,
      ["a", {"problem": "b"}],
      3,
      cfg,
      progress=lambda d, n, t: seen.append((d, n)),
    )
  )
  assert [(t.problem_index, t.sample_index) for t in trajs] == [
    (p, s) for p in range(2) for s in range(3)
  ]
  assert sorted(seen) == [(i, 6) for i in range(1, 7)]
  seeds = [r.sampling.seed for r in eng.requests]
  assert None not in seeds and len(set(seeds)) == len(seeds) == 12
  eng2 = ScriptedEngine(tokenizer, _turns(call_text("print(1+2)"), FINAL))
  asyncio.run(run_agent_loop(eng2, tokenizer, FakePool(), ["a", "b"], 3, cfg))
  assert sorted(seeds) == sorted(r.sampling.seed for r in eng2.requests)
  sessions = {c[3] for c in pool.calls}
  assert len(sessions) == 6 and None not in sessions


def test_config_validation():
  with pytest.raises(ValueError, match="max_turns"):
    RolloutSettings(max_turns=0)
  with pytest.raises(ValueError, match="top_p"):
    RolloutSettings(top_p=0.0)
  with pytest.raises(dataclasses.FrozenInstanceError):
    RolloutSettings().max_turns = 3


def test_with_real_code_pool(tokenizer):
  from rstar_jax.tools.code_pool import CodePool

  code_err = "print(undefined_name)"
  eng = ScriptedEngine(
    tokenizer,
    _turns(
      call_text("import sys\nprint(int(sys.stdin.read())*2)", "21"), call_text(code_err), FINAL
    ),
  )

  async def main():
    async with CodePool(num_workers=2) as pool:
      return await run_trajectory(
        eng, tokenizer, pool, "double 21", RolloutSettings(response_budget=3000)
      )

  t = asyncio.run(main())
  assert [c.status for c in t.tool_calls] == ["ok", "error"]
  assert "stdout: 42" in t.tool_calls[0].output_text and t.tool_calls[0].duration_s > 0
  assert "NameError" in t.tool_calls[1].output_text
  assert "stdout: 42" in t.response_text and t.finish_reason == "stop"


def test_session_lost_reaches_the_policy_as_a_tool_error(tokenizer):
  """A tool node that died with the trajectory's session (issue 41): the policy reads a tool
  failure saying its variables are gone, and the trajectory goes on (not re-rolled as a lost
  worker, which "internal_error" would be)."""
  eng = ScriptedEngine(tokenizer, _turns(call_text("print(x)"), FINAL))
  t = _run(eng, tokenizer, FakePool(status="session_lost"), RolloutSettings(response_budget=600))
  assert [c.status for c in t.tool_calls] == ["session_lost"]
  text = t.tool_calls[0].output_text
  assert "Tool call failure" in text and "reason: session_lost" in text
  assert "variables failed" in text and "re-run what you need" in text
  assert t.finish_reason == "stop" and t.num_turns == 2
  # The step's metrics and RoC's p_err count it as a failed call (not an unknown status).
  m = rl_metrics.trajectory_metrics([t], [1.0]) | rl_metrics.tool_latency_metrics([t])
  assert m["tool_error_ratio"] == 1.0 and m["pos_tool_error_ratio"] == 1.0
  assert m["tool_status_session_lost_frac"] == 1.0
  assert quality.p_err([c.status for c in t.tool_calls]) == 1.0


def test_every_tool_status_is_known_wherever_statuses_are_listed():
  """The code pool's statuses (session_lost included) are each rendered with a reason, counted
  as a failure by the step metrics, and known to RoC's p_err; a new status added to the pool
  but not to these lists fails here."""
  from rstar_jax.tools import code_pool, render

  for s in code_pool.STATUSES:
    assert s in quality.KNOWN_STATUSES, s
    if s == "ok":
      continue
    assert s in rl_metrics.FAILURE_STATUSES and s in code_pool.FAILURE_STATUSES, s
    text = render.render_tool_response(code_pool.ExecResult(s, "", "", 0.0))
    assert text.startswith("Tool call failure\nreason: " + s), (s, text)
  assert "parse_error" in rl_metrics.FAILURE_STATUSES and "parse_error" in quality.KNOWN_STATUSES
