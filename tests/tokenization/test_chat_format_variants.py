"""Chat-format variants: the released rStar2-Agent prompt, character for character, its
tool-turn joining, and the Qwen3 thinking layout with a code_interpreter tool (ASTER)."""

import json

import pytest

from rstar_jax.tokenization import chat_format as cf

# The released prompt for the question "What is 1+1?", written out from microsoft/rStar
# rstar2_agent/config/rstar2_agent_trainer.yaml (custom_chat_template, rendered with tools and
# add_generation_prompt=True) and tool_config/python_tool_config.yaml (the tool schema as verl
# dumps it: pydantic field order, unset fields dropped, HF's tojson separators).
RELEASED_PROMPT = (
  "<|im_start|>system\n"
  "A conversation between User and Assistant. The User asks a question, and the Assistant "
  "solves it. The Assistant first thinks about the reasoning process in the mind and then "
  "provides the User with the answer. The reasoning process is enclosed within <reason> "
  "</reason> and answer is enclosed within <answer> </answer> tags, respectively, i.e., "
  "<reason> reasoning process here </reason> <answer> answer here </answer>."
  "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
  '{"type": "function", "function": {"name": "python_code_with_standard_io", "description": '
  '"Execute Python code with standard input and capture standard output. This function takes '
  "a Python code string and an input string, provides the input string through standard input "
  "(stdin) to the code, and captures and returns any output produced through standard output "
  "(stdout). If the executed code raises an exception, the error message will be captured and "
  'returned instead.", "parameters": {"type": "object", "properties": {"code": {"type": '
  '"string", "description": "A string containing Python code to be executed. The code can '
  'read from standard input using the input() function."}, "input": {"type": "string", '
  '"description": "A string that will be provided as standard input to the code when it '
  'calls input()."}}, "required": ["code", "input"]}}}'
  "\n</tools>\n\nFor each function call, return a json object with function name and "
  "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
  '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
  "<|im_start|>user\nYou must put your answer inside <answer> </answer> tags, i.e., <answer> "
  "answer here </answer>. And your final answer will be extracted automatically by the "
  "\\boxed{} tag.\nThis is the problem:\nWhat is 1+1?<|im_end|>\n"
  "<|im_start|>assistant\n<reason>"
)

# verl's loop renders [tool, tool] with the template (no tools), strips the system prefix and
# appends the rest right after the assistant's generated <|im_end|>.
RELEASED_TOOL_TURN = (
  "<|im_start|>user\n<tool_response>\nA\n</tool_response>\n"
  "<tool_response>\nB\n</tool_response><|im_end|>\n"
  "<|im_start|>assistant\n<reason>"
)


def test_released_prompt_character_for_character():
  got = cf.prompt_text("rstar2_released", "What is 1+1?")
  if got != RELEASED_PROMPT:  # point at the first differing character
    i = next(i for i, (a, b) in enumerate(zip(got, RELEASED_PROMPT)) if a != b)
    pytest.fail(f"differs at {i}: {got[i - 20 : i + 20]!r} vs {RELEASED_PROMPT[i - 20 : i + 20]!r}")
  assert cf.get_format("rstar2_released").tool_name == "python_code_with_standard_io"


def test_released_tool_turn_has_no_leading_newline(tokenizer):
  assert cf.tool_turn_text("rstar2_released", ["A", "B"]) == RELEASED_TOOL_TURN
  assert cf.tool_turn_text("rstar2", ["A", "B"]) == "\n" + RELEASED_TOOL_TURN
  ids = cf.tool_turn_ids(tokenizer, "rstar2_released", "A")
  assert tokenizer.decode(ids, skip_special_tokens=False).startswith("<|im_start|>user\n")


def test_qwen3_thinking_code_interpreter():
  text = cf.prompt_text("qwen3_thinking", "Find 2+2.")
  assert text.startswith("<|im_start|>system\n# Tools\n\n")
  assert text.endswith(
    "</tool_call><|im_end|>\n<|im_start|>user\nFind 2+2.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n"
  )
  schema = json.loads(text.split("<tools>\n")[1].split("\n</tools>")[0])
  assert schema["function"]["name"] == "code_interpreter"
  assert schema["function"]["parameters"]["required"] == ["code"]
  assert cf.tool_turn_text("qwen3_thinking", "4").endswith(
    "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"
  )
  call = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "x = 2"}}\n</tool_call>'
  [parsed] = cf.parse_tool_calls(call, cf.QWEN3_THINKING.tool_name)
  assert parsed.error is None and parsed.code == "x = 2" and parsed.stdin == ""


def test_unknown_format_error():
  with pytest.raises(ValueError, match="chat format must be one of"):
    cf.get_format("chatml")
