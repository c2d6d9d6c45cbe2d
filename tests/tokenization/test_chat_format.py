import json

import pytest

from rstar_jax.tokenization import chat_format as cf


def test_prompt_layout(tokenizer):
  q = "Find 3+4."
  text = cf.prompt_text("rstar2", q)
  assert text.startswith("<|im_start|>system\n" + cf.SYSTEM_PROMPT + "\n\n# Tools")
  assert '"name": "execute_python_code_with_standard_io"' in text
  assert text.endswith(
    "<|im_end|>\n<|im_start|>user\n"
    + cf.USER_PREFIX
    + q
    + "<|im_end|>\n<|im_start|>assistant\n<reason>"
  )
  ids = cf.prompt_ids(tokenizer, "rstar2", q)
  assert tokenizer.decode(ids, skip_special_tokens=False) == text
  schema = json.loads(text.split("<tools>\n")[1].split("\n</tools>")[0])
  assert schema["function"]["parameters"]["required"] == ["code", "input"]


def test_chat_template_matches_renderer(tokenizer):
  q = "What is 2+2?"
  assert tokenizer.apply_chat_template(
    [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
  ) == cf.prompt_text("rstar2", q)
  msgs = [
    {"role": "user", "content": q},
    {
      "role": "assistant",
      "content": "<reason>run",
      "tool_calls": [
        {"function": {"name": cf.TOOL_NAME, "arguments": {"code": "print(4)", "input": ""}}}
      ],
    },
    {"role": "tool", "content": "Tool call success\nstdout: 4"},
    {"role": "tool", "content": "second"},
    {"role": "assistant", "content": "done</reason><answer>\\boxed{4}</answer>"},
  ]
  r = cf.render_chat_ids(tokenizer, msgs)
  full = tokenizer.apply_chat_template(msgs, tokenize=False)
  assert tokenizer.decode(r.input_ids, skip_special_tokens=False) + "\n" == full
  # mask: 1 exactly on assistant-written text (+ its <|im_end|>), 0 on tool turns
  im_end = cf.stop_token_id(tokenizer)
  tool_ids = cf.tool_turn_ids(tokenizer, "rstar2", ["Tool call success\nstdout: 4", "second"])
  assert tool_ids[0:1] == tokenizer.encode("\n", add_special_tokens=False)
  k = r.response_ids.index(im_end) + 1
  assert r.loss_mask[:k] == [1] * k
  assert r.response_ids[k : k + len(tool_ids)] == tool_ids
  assert r.loss_mask[k : k + len(tool_ids)] == [0] * len(tool_ids)
  assert r.loss_mask[k + len(tool_ids) :] == [1] * (len(r.response_ids) - k - len(tool_ids))
  assert r.response_ids[-1] == im_end
  assert len(r.full_loss_mask) == len(r.input_ids)


def test_tool_turn_template(tokenizer):
  text = cf.tool_turn_text("rstar2", ["a", "b"])
  assert text == (
    "\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>"
    "\nb\n</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>"
  )
  assert tokenizer.decode(
    cf.tool_turn_ids(tokenizer, "rstar2", "x"), skip_special_tokens=False
  ) == cf.tool_turn_text("rstar2", "x")
  with pytest.raises(ValueError, match="no tool response"):
    cf.tool_turn_text("rstar2", [])


def test_parse_tool_calls():
  good = cf.format_tool_call("print(1)", "5")
  calls = cf.parse_tool_calls("think" + good + " more " + good)
  assert [(c.error, c.code, c.stdin) for c in calls] == [(None, "print(1)", "5")] * 2
  assert cf.parse_tool_calls("no calls here <tool_call> unterminated") == []
  bad = cf.parse_tool_calls("<tool_call>{not json}</tool_call>")
  assert len(bad) == 1 and bad[0].error.startswith("Failed to decode tool call: ")
  missing = cf.parse_tool_calls('<tool_call>{"name": "x"}</tool_call>')
  assert missing[0].error.startswith("Failed to decode tool call")
  other = cf.parse_tool_calls('<tool_call>{"name": "rm", "arguments": {"code": ""}}</tool_call>')
  assert "unknown tool 'rm'" in other[0].error
  nocode = cf.parse_tool_calls(
    '<tool_call>{"name": "%s", "arguments": {"input": "1"}}</tool_call>' % cf.TOOL_NAME
  )
  assert "string 'code'" in nocode[0].error
  as_str = cf.parse_tool_calls(
    '<tool_call>{"name": "%s", "arguments": "{\\"code\\": \\"x\\"}"}</tool_call>' % cf.TOOL_NAME
  )
  assert as_str[0].error is None and as_str[0].code == "x" and as_str[0].stdin == ""


def test_render_chat_errors(tokenizer):
  with pytest.raises(ValueError, match="start with a user"):
    cf.render_chat_ids(tokenizer, [{"role": "assistant", "content": "x"}])
  with pytest.raises(ValueError, match="end with an assistant"):
    cf.render_chat_ids(tokenizer, [{"role": "user", "content": "x"}])
  with pytest.raises(ValueError, match=r"messages\[2\]: expected role 'tool'"):
    cf.render_chat_ids(
      tokenizer,
      [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "a"},
        {"role": "assistant", "content": "b"},
      ],
    )
