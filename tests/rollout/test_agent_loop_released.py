"""The agent loop with the released rStar2-Agent tool-loop settings: one call per turn, the
256-character middle truncation, 5 assistant turns and the released tool name / joining."""

import asyncio

import pytest
from rollout_helpers import FakePool, ScriptedEngine

from rstar_jax.rollout import agent_loop
from rstar_jax.rollout.agent_loop import RolloutSettings, run_trajectory
from rstar_jax.tokenization import chat_format as cf

RELEASED = dict(
  chat_format="rstar2_released",
  max_parallel_calls=1,
  max_tool_response_chars=256,
  tool_truncation="released",
  max_turns=5,
)


def _call(code):
  return cf.format_tool_call(code, "", "python_code_with_standard_io")


def test_truncate_middle_released():
  text = "a" * 200 + "b" * 200
  out = agent_loop.truncate_middle_released(text, 256)
  assert out == "a" * 128 + "...(truncated)..." + "b" * 128 and len(out) == 256 + 17
  assert agent_loop.truncate_middle_released("short", 256) == "short"
  assert agent_loop.truncate_middle_released("abcdef", 3) == "a...(truncated)...f"
  with pytest.raises(ValueError, match="max_chars"):
    agent_loop.truncate_middle_released("x", 0)


def test_released_loop_first_call_only_truncated_joined_without_newline(tokenizer):
  two = "run." + _call("print(1+1)") + _call("print(2+2)")
  eng = ScriptedEngine(tokenizer, lambda r, t: two if t == 0 else "done")
  pool = FakePool()
  long_render = lambda res, n: ("x" * 300 + res.stdout.strip())[:n]  # noqa: E731
  t = asyncio.run(
    run_trajectory(
      eng,
      tokenizer,
      pool,
      "Q",
      RolloutSettings(response_budget=4000, **RELEASED),
      render=long_render,
    )
  )
  assert [c[0] for c in pool.calls] == ["print(1+1)"]  # max_parallel_calls = 1
  body = t.tool_calls[0].output_text
  assert body == "x" * 128 + "...(truncated)..." + ("x" * 300 + "2")[-128:]
  assert t.prompt_ids == cf.prompt_ids(tokenizer, "rstar2_released", "Q")
  assert t.response_text.startswith(two + "<|im_end|><|im_start|>user\n<tool_response>\n")


def test_released_loop_stops_after_five_assistant_turns(tokenizer):
  eng = ScriptedEngine(tokenizer, lambda r, t: "again." + _call("print(1+1)"))
  t = asyncio.run(
    run_trajectory(
      eng,
      tokenizer,
      FakePool(),
      "Q",
      RolloutSettings(response_budget=20000, **RELEASED),
      render=lambda r, n: r.stdout.strip(),
    )
  )
  assert (t.num_turns, t.finish_reason, len(t.tool_calls)) == (5, "max_turns", 4)


def test_project_tool_name_is_refused_by_released_format(tokenizer):
  eng = ScriptedEngine(
    tokenizer, lambda r, t: cf.format_tool_call("print(1+1)") if t == 0 else "done"
  )
  t = asyncio.run(
    run_trajectory(
      eng, tokenizer, FakePool(), "Q", RolloutSettings(response_budget=4000, **RELEASED)
    )
  )
  assert t.tool_calls[0].status == "parse_error"
  assert "python_code_with_standard_io" in t.tool_calls[0].output_text


def test_config_rejects_unknown_options():
  with pytest.raises(ValueError, match="RolloutSettings.tool_truncation"):
    RolloutSettings(tool_truncation="left")
  with pytest.raises(ValueError, match="RolloutSettings.chat_format"):
    RolloutSettings(chat_format="chatml")


@pytest.mark.parametrize("fmt", ["rstar2_released", "qwen3_thinking"])
def test_sft_renderer_matches_agent_loop_per_format(tokenizer, fmt):
  f = cf.get_format(fmt)
  # A Qwen3 thinking model closes the <think> its prefill opened; the chat carries that
  # reasoning as reasoning_content (Qwen3's template).
  think = "hmm\n</think>\n\n" if f.thinking else ""
  call = think + "run." + cf.format_tool_call("print(2+2)", "", f.tool_name, f.call_fields)
  eng = ScriptedEngine(tokenizer, lambda r, t: call if t == 0 else think + "so 4 \\boxed{4}")
  t = asyncio.run(
    run_trajectory(
      eng,
      tokenizer,
      FakePool(),
      "Q",
      RolloutSettings(response_budget=4000, chat_format=fmt),
      render=lambda r, n: r.stdout.strip(),
    )
  )
  reasoning = {"reasoning_content": "hmm"} if f.thinking else {}
  msgs = [
    {"role": "user", "content": "Q"},
    {
      "role": "assistant",
      "content": "run.",
      "tool_calls": [{"function": {"name": f.tool_name, "arguments": {"code": "print(2+2)"}}}],
      **reasoning,
    },
    {"role": "tool", "content": "4"},
    {"role": "assistant", "content": "so 4 \\boxed{4}", **reasoning},
  ]
  r = cf.render_chat_ids(tokenizer, msgs, fmt=fmt)
  assert (r.prompt_ids, r.response_ids, r.loss_mask) == (t.prompt_ids, t.response_ids, t.loss_mask)
