"""The Qwen3 chat formats token for token against Qwen3's own templates (qwen3_reference.py)
rendered by transformers' `apply_chat_template`: system + tools, multi-turn tool calls,
`reasoning_content` and inline <think>, the generation prompt; and `chat_template(fmt)` (what
the export writes) against both the references and our renderer."""

import copy

import pytest
from qwen3_reference import QWEN3_HYBRID, QWEN3_THINKING, qwen3_like_tokenizer

from rstar_jax.tokenization import chat_format as cf

pytest.importorskip("jinja2")

SCHEMA = dict(cf.QWEN3_THINKING.tool_schema)
SYSTEM = "You are a careful solver. Use the tool."
Q = "Find the sum of the first 10 primes."


def _call(code, as_string=False):
  args = {"code": code}
  return {
    "type": "function",
    "function": {
      "name": "code_interpreter",
      "arguments": cf.json.dumps(args) if as_string else args,
    },
  }


# A whole agentic chat: reasoning_content on every turn, two parallel calls, a call after
# content, string arguments (rendered verbatim), a non-ASCII argument, inline <think> at the end.
CHAT = [
  {"role": "user", "content": Q},
  {
    "role": "assistant",
    "reasoning_content": "\nI list primes with code.\n",
    "content": "",
    "tool_calls": [_call("from sympy import prime\nprint(prime(10))"), _call("print(2+3)  # é")],
  },
  {"role": "tool", "content": "29"},
  {"role": "tool", "content": "5"},
  {
    "role": "assistant",
    "reasoning_content": "Now sum them — é.",
    "content": "Summing.",
    "tool_calls": [_call('print(sum([2,3,5,7,11,13,17,19,23,29]), "é")', as_string=True)],
  },
  {"role": "tool", "content": "129 é"},
  {"role": "assistant", "content": "<think>\nThe sum is 129.\n</think>\n\nThe answer is 129."},
]


@pytest.fixture(scope="module")
def tok():
  corpus = [SYSTEM, Q, cf.QWEN3_THINKING.tools_block, cf.format_tool_call("print(1)", "", "x")]
  corpus += [m.get("content", "") + m.get("reasoning_content", "") for m in CHAT] * 3
  return qwen3_like_tokenizer(corpus, QWEN3_THINKING)


def _ids(tok, template, messages, **kw):
  text = tok.apply_chat_template(messages, chat_template=template, tokenize=False, **kw)
  return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("fmt,ref", [("qwen3_thinking", QWEN3_THINKING), ("qwen3", QWEN3_HYBRID)])
def test_prompt_matches_qwen3_template(tok, fmt, ref):
  gen = {"add_generation_prompt": True}
  with_sys = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": Q}]
  assert cf.prompt_ids(tok, fmt, Q, SYSTEM) == _ids(tok, ref, with_sys, tools=[SCHEMA], **gen)
  bare = [{"role": "user", "content": Q}]
  assert cf.prompt_ids(tok, fmt, Q) == _ids(tok, ref, bare, tools=[SCHEMA], **gen)
  # No tools and no system text: Qwen3 writes no system turn at all.
  assert cf.prompt_ids(tok, fmt, Q, with_tools=False) == _ids(tok, ref, bare, **gen)
  assert cf.prompt_ids(tok, fmt, Q, SYSTEM, with_tools=False) == _ids(tok, ref, with_sys, **gen)
  # The exported template's generation prompt, thinking switched off too (hybrid template).
  ours = cf.chat_template(fmt)
  assert _ids(tok, ours, bare, **gen) == _ids(tok, ref, bare, tools=[SCHEMA], **gen)
  off = {"enable_thinking": False, **gen}
  assert _ids(tok, ours, bare, **off) == _ids(tok, ref, bare, tools=[SCHEMA], **off)


@pytest.mark.parametrize("fmt,ref", [("qwen3_thinking", QWEN3_THINKING), ("qwen3", QWEN3_HYBRID)])
@pytest.mark.parametrize("system", [False, True])
def test_agentic_chat_matches_qwen3_template(tok, fmt, ref, system):
  chat = ([{"role": "system", "content": SYSTEM}] if system else []) + copy.deepcopy(CHAT)
  r = cf.render_chat_ids(tok, chat, fmt=fmt)
  want = _ids(tok, ref, chat, tools=[SCHEMA])
  nl = tok.encode("\n", add_special_tokens=False)
  assert r.input_ids + nl == want, (tok.decode(r.input_ids), tok.decode(want))
  # The reasoning is rendered and trained on (mask 1), never dropped.
  text = tok.decode(r.response_ids, skip_special_tokens=False)
  for m in CHAT:
    if m.get("reasoning_content"):
      assert m["reasoning_content"].strip("\n") + "\n</think>" in text
  masked = tok.decode(
    [t for t, k in zip(r.response_ids, r.loss_mask) if k], skip_special_tokens=False
  )
  assert "I list primes with code.\n</think>\n\n<tool_call>" in masked
  assert "<tool_response>" not in masked
  # The exported template renders the same chat the same way, with or without `tools`.
  ours = cf.chat_template(fmt)
  assert _ids(tok, ours, chat, tools=[SCHEMA]) == want
  assert _ids(tok, ours, chat) == want


def test_hybrid_template_bare_turn_without_reasoning(tok):
  """Qwen3's hybrid template writes a non-final turn without reasoning as its bare content;
  the thinking template still opens (an empty) think block."""
  chat = [
    {"role": "user", "content": Q},
    {"role": "assistant", "content": "Let me run it.", "tool_calls": [_call("print(7)")]},
    {"role": "tool", "content": "7"},
    {"role": "assistant", "reasoning_content": "Seven.", "content": "7"},
  ]
  nl = tok.encode("\n", add_special_tokens=False)
  for fmt, ref in (("qwen3", QWEN3_HYBRID), ("qwen3_thinking", QWEN3_THINKING)):
    want = _ids(tok, ref, chat, tools=[SCHEMA])
    assert cf.render_chat_ids(tok, chat, fmt=fmt).input_ids + nl == want, fmt
    assert _ids(tok, cf.chat_template(fmt), chat) == want, fmt
  assert "<|im_start|>assistant\nLet me run it.\n<tool_call>" in tok.decode(
    _ids(tok, QWEN3_HYBRID, chat, tools=[SCHEMA]), skip_special_tokens=False
  )


def test_agent_loop_pieces_match_the_template(tok):
  """What the agent loop concatenates (prompt ids, generated text, tool-turn ids) is the
  template's rendering of the same conversation, token for token."""
  gen1 = "run it\n</think>\n\n" + cf.format_tool_call("print(7)", "", "code_interpreter", ("code",))
  ids = cf.prompt_ids(tok, "qwen3_thinking", Q) + tok.encode(gen1, add_special_tokens=False)
  ids += [cf.stop_token_id(tok)] + cf.tool_turn_ids(tok, "qwen3_thinking", "7")
  ids += tok.encode("7 it is\n</think>\n\n7", add_special_tokens=False) + [cf.stop_token_id(tok)]
  chat = [
    {"role": "user", "content": Q},
    # format_tool_call puts "\n" before <tool_call>: content "\n" to Qwen3's template
    {
      "role": "assistant",
      "reasoning_content": "run it",
      "content": "\n",
      "tool_calls": [_call("print(7)")],
    },
    {"role": "tool", "content": "7"},
    {"role": "assistant", "reasoning_content": "7 it is", "content": "7"},
  ]
  assert ids + tok.encode("\n", add_special_tokens=False) == _ids(
    tok, QWEN3_THINKING, chat, tools=[SCHEMA]
  )


def test_reasoning_content_in_an_rstar2_chat_is_an_error(tok):
  chat = [
    {"role": "user", "content": Q},
    {"role": "assistant", "reasoning_content": "hidden", "content": "x"},
  ]
  with pytest.raises(ValueError, match=r"messages\[1\].reasoning_content: format 'rstar2'"):
    cf.render_chat_ids(tok, chat)
