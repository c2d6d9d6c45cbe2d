"""rStar2-Agent / ASTER prompt and turn rendering, token-in/token-out.

Prompt  = <|im_start|>system\\n{SYSTEM_PROMPT}\\n\\n{Hermes tool block}<|im_end|>\\n
          <|im_start|>user\\n{USER_PREFIX}{question}<|im_end|>\\n
          <|im_start|>assistant\\n<reason>
The model writes an assistant turn and ends it with <|im_end|> (a stop token). A tool turn is
appended as the ids of the fixed template TOOL_TURN (loss mask 0); the leading "\\n" is ChatML's
newline after <|im_end|>. Several calls in one turn give one user turn with one
<tool_response> block per call (consecutive tool messages merge). Generated ids are never
decoded and re-encoded: the agent loop decodes only to parse tool calls.

`render_chat_ids` renders a whole trajectory (messages) for SFT with the same pieces, so a
trajectory written by the agent loop and the same conversation rendered for SFT agree token
for token (as long as the model's ids are the canonical encoding of its text).

Formats (`ChatFormat`, looked up by name with `get_format`; every function takes ``fmt``):
  "rstar2"           this project's default: tool `execute_python_code_with_standard_io`,
                     shortened descriptions, tool turn led by ChatML's "\\n".
  "rstar2_released"  the released rStar2-Agent code (microsoft/rStar,
                     rstar2_agent/config/rstar2_agent_trainer.yaml custom_chat_template and
                     tool_config/python_tool_config.yaml): tool `python_code_with_standard_io`
                     with the released descriptions; the tool turn is appended right after the
                     assistant's <|im_end|> with no newline (verl's agent loop renders the tool
                     messages with the template and strips the system prefix).
  "qwen3_thinking"   ASTER: the Qwen3 thinking template (no system text, bare user turn, the
                     generation prompt opens <think>) with a stateful `code_interpreter` tool
                     that takes only `code`.
See docs/fidelity.md.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

TOOL_NAME = "execute_python_code_with_standard_io"
SYSTEM_PROMPT = (
  "A conversation between User and Assistant. The User asks a question, and the Assistant "
  "solves it. The Assistant first thinks about the reasoning process in the mind and then "
  "provides the User with the answer. The reasoning process is enclosed within <reason> "
  "</reason> and answer is enclosed within <answer> </answer> tags, respectively, i.e., "
  "<reason> reasoning process here </reason> <answer> answer here </answer>."
)
TOOL_SCHEMA = {
  "type": "function",
  "function": {
    "name": TOOL_NAME,
    "description": (
      "Execute Python code with standard input and capture standard output. "
      "This function takes a Python code string and an input string, executes "
      "the code with the input as stdin, and returns the stdout. If the "
      "executed code raises an exception, the error message will be captured "
      "and returned instead."
    ),
    "parameters": {
      "type": "object",
      "properties": {
        "code": {"type": "string", "description": "A string of Python code to execute."},
        "input": {
          "type": "string",
          "description": "A string passed to the code as standard input.",
        },
      },
      "required": ["code", "input"],
    },
  },
}
TOOLS_BLOCK = (
  "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
  + json.dumps(TOOL_SCHEMA)
  + "\n</tools>\n\n"
  "For each function call, return a json object with function name and arguments within "
  "<tool_call></tool_call> XML tags:\n<tool_call>\n"
  '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
USER_PREFIX = (
  "You must put your answer inside <answer> </answer> tags, i.e., <answer> answer "
  "here </answer>. And your final answer will be extracted automatically by the "
  "\\boxed{} tag.\nThis is the problem:\n"
)
GENERATION_PROMPT = "<|im_start|>assistant\n<reason>"
TOOL_TURN_HEAD = "\n<|im_start|>user\n"
TOOL_RESPONSE_BLOCK = "<tool_response>\n{text}\n</tool_response>"
TOOL_TURN_TAIL = "<|im_end|>\n" + GENERATION_PROMPT
IM_END = "<|im_end|>"

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def system_text(system_prompt: str = SYSTEM_PROMPT, with_tools: bool = True) -> str:
  return system_prompt + ("\n\n" + TOOLS_BLOCK if with_tools else "")


def build_prompt_text(
  question: str, system_prompt: str = SYSTEM_PROMPT, with_tools: bool = True
) -> str:
  """The rendered prompt string, ending with the `<|im_start|>assistant\\n<reason>` prefill."""
  if not isinstance(question, str):
    raise TypeError(f"build_prompt_text: question must be str, got {type(question).__name__}")
  return (
    f"<|im_start|>system\n{system_text(system_prompt, with_tools)}<|im_end|>\n"
    f"<|im_start|>user\n{USER_PREFIX}{question}<|im_end|>\n{GENERATION_PROMPT}"
  )


def _encode(tokenizer, text: str) -> list[int]:
  return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


def build_prompt_ids(
  tokenizer, question: str, system_prompt: str = SYSTEM_PROMPT, with_tools: bool = True
) -> list[int]:
  """Prompt token ids [P] for one question (system + tools + user prefix + prefill)."""
  return _encode(tokenizer, build_prompt_text(question, system_prompt, with_tools))


def tool_turn_text(texts: str | Sequence[str]) -> str:
  """The tool (user) turn for one or several tool-response bodies, ending in the prefill."""
  texts = [texts] if isinstance(texts, str) else list(texts)
  if not texts:
    raise ValueError("tool_turn_text: no tool response texts")
  blocks = "\n".join(TOOL_RESPONSE_BLOCK.format(text=t) for t in texts)
  return TOOL_TURN_HEAD + blocks + TOOL_TURN_TAIL


def tool_turn_ids(tokenizer, texts: str | Sequence[str]) -> list[int]:
  """Ids of the tool turn appended after an assistant `<|im_end|>` (all loss mask 0)."""
  return _encode(tokenizer, tool_turn_text(texts))


def stop_token_id(tokenizer) -> int:
  """The id of `<|im_end|>`, which ends every assistant turn."""
  tid = tokenizer.convert_tokens_to_ids(IM_END)
  if tid is None or tid == getattr(tokenizer, "unk_token_id", -1):
    raise ValueError(f"tokenizer has no {IM_END} token")
  return int(tid)


# ------------------------------------------------------------------------------- formats


def _tools_block(schema: Mapping[str, Any]) -> str:
  """The Hermes tool block of the Qwen / rStar2 templates for one tool."""
  return (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(schema, ensure_ascii=False)
    + "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
  )


@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """One prompt / tool-turn layout.

  Attributes:
      name: registry name (`get_format`).
      tool_schema: the OpenAI-style function schema shown in the system turn.
      system_prompt: text before the tool block ("" = the tool block alone).
      user_prefix: text put before the question in the user turn.
      generation_prompt: the assistant prefill ending the prompt and every tool turn.
      tool_turn_lead: text between the assistant's <|im_end|> and the tool turn's
          <|im_start|> ("\\n" = ChatML; "" = the released rStar2 loop).
      call_fields: argument names `format_tool_call` writes (("code", "input") or ("code",)).
  """

  name: str
  tool_schema: Mapping[str, Any]
  system_prompt: str
  user_prefix: str
  generation_prompt: str
  tool_turn_lead: str = "\n"
  call_fields: tuple = ("code", "input")

  @property
  def tool_name(self) -> str:
    return self.tool_schema["function"]["name"]

  @property
  def tools_block(self) -> str:
    return _tools_block(self.tool_schema)


_RELEASED_SCHEMA = {
  "type": "function",
  "function": {
    "name": "python_code_with_standard_io",
    "description": (
      "Execute Python code with standard input and capture standard output. "
      "This function takes a Python code string and an input string, provides "
      "the input string through standard input (stdin) to the code, and "
      "captures and returns any output produced through standard output "
      "(stdout). If the executed code raises an exception, the error message "
      "will be captured and returned instead."
    ),
    "parameters": {
      "type": "object",
      "properties": {
        "code": {
          "type": "string",
          "description": (
            "A string containing Python code to be executed. The "
            "code can read from standard input using the input() "
            "function."
          ),
        },
        "input": {
          "type": "string",
          "description": (
            "A string that will be provided as standard input to the code when it calls input()."
          ),
        },
      },
      "required": ["code", "input"],
    },
  },
}
# ASTER's tool: one stateful Python session per trajectory. Name from the ASTER paper; the
# description is ours (the reproduction's exact wording is not public in this form).
_CODE_INTERPRETER_SCHEMA = {
  "type": "function",
  "function": {
    "name": "code_interpreter",
    "description": (
      "Execute Python code in a stateful interpreter: variables, imports and "
      "definitions persist across calls within this conversation. Returns "
      "the standard output, or the error message if the code raises."
    ),
    "parameters": {
      "type": "object",
      "properties": {"code": {"type": "string", "description": "The Python code to execute."}},
      "required": ["code"],
    },
  },
}

RSTAR2 = ChatFormat("rstar2", TOOL_SCHEMA, SYSTEM_PROMPT, USER_PREFIX, GENERATION_PROMPT)
RSTAR2_RELEASED = ChatFormat(
  "rstar2_released",
  _RELEASED_SCHEMA,
  SYSTEM_PROMPT,
  USER_PREFIX,
  GENERATION_PROMPT,
  tool_turn_lead="",
)
QWEN3_THINKING = ChatFormat(
  "qwen3_thinking",
  _CODE_INTERPRETER_SCHEMA,
  "",
  "",
  "<|im_start|>assistant\n<think>\n",
  call_fields=("code",),
)
FORMATS = {f.name: f for f in (RSTAR2, RSTAR2_RELEASED, QWEN3_THINKING)}


def get_format(fmt: str | ChatFormat) -> ChatFormat:
  """A `ChatFormat` by name (or returned as is); ValueError lists the known names."""
  if isinstance(fmt, ChatFormat):
    return fmt
  if fmt not in FORMATS:
    raise ValueError(f"chat format must be one of {sorted(FORMATS)}, got {fmt!r}")
  return FORMATS[fmt]


def prompt_text(
  fmt: str | ChatFormat, question: str, system_prompt: str | None = None, with_tools: bool = True
) -> str:
  """The rendered prompt of ``question`` in format ``fmt`` (ends with its prefill).

  ``system_prompt`` replaces the format's system text (None = the format's); ``with_tools``
  False leaves the tool block out. For "rstar2" this equals `build_prompt_text`.
  """
  f = get_format(fmt)
  if not isinstance(question, str):
    raise TypeError(f"prompt_text: question must be str, got {type(question).__name__}")
  sp = f.system_prompt if system_prompt is None else system_prompt
  tools = f.tools_block if with_tools else ""
  system = sp + ("\n\n" if sp and tools else "") + tools
  return (
    f"<|im_start|>system\n{system}<|im_end|>\n"
    f"<|im_start|>user\n{f.user_prefix}{question}<|im_end|>\n{f.generation_prompt}"
  )


def prompt_ids(
  tokenizer,
  fmt: str | ChatFormat,
  question: str,
  system_prompt: str | None = None,
  with_tools: bool = True,
) -> list[int]:
  return _encode(tokenizer, prompt_text(fmt, question, system_prompt, with_tools))


def format_tool_turn_text(fmt: str | ChatFormat, texts: str | Sequence[str]) -> str:
  """The tool turn of ``fmt`` for one or several tool-response bodies."""
  f = get_format(fmt)
  texts = [texts] if isinstance(texts, str) else list(texts)
  if not texts:
    raise ValueError("format_tool_turn_text: no tool response texts")
  blocks = "\n".join(TOOL_RESPONSE_BLOCK.format(text=t) for t in texts)
  return f.tool_turn_lead + "<|im_start|>user\n" + blocks + "<|im_end|>\n" + f.generation_prompt


def format_tool_turn_ids(tokenizer, fmt: str | ChatFormat, texts: str | Sequence[str]) -> list[int]:
  return _encode(tokenizer, format_tool_turn_text(fmt, texts))


# ------------------------------------------------------------------------------- tool calls


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One parsed <tool_call>. `error` is None for a valid call; otherwise the text returned to
  the model as the tool response (status "parse_error")."""

  name: str
  arguments: Mapping[str, Any]
  error: str | None = None

  @property
  def code(self) -> str:
    return str(self.arguments.get("code", "")) if self.error is None else ""

  @property
  def stdin(self) -> str:
    v = self.arguments.get("input", "") if self.error is None else ""
    return "" if v is None else str(v)


def _parse_one(body: str, tool_name: str) -> ToolCall:
  try:
    obj = json.loads(body)
  except json.JSONDecodeError as e:
    return ToolCall("", {}, f"Failed to decode tool call: {e}")
  if not isinstance(obj, dict) or "name" not in obj or "arguments" not in obj:
    return ToolCall(
      "",
      {},
      "Failed to decode tool call: expected a JSON object with "
      f"'name' and 'arguments', got {body.strip()[:200]!r}",
    )
  name, args = obj["name"], obj["arguments"]
  if isinstance(args, str):  # some models emit arguments as a JSON string
    try:
      args = json.loads(args)
    except json.JSONDecodeError as e:
      return ToolCall(str(name), {}, f"Failed to decode tool call: arguments: {e}")
  if name != tool_name:
    return ToolCall(
      str(name),
      {},
      f"Error when executing tool: unknown tool {name!r}; the only tool is {tool_name!r}",
    )
  if not isinstance(args, dict) or not isinstance(args.get("code"), str):
    return ToolCall(
      str(name),
      {},
      "Error when executing tool: arguments must be an object "
      "with a string 'code' (and optional string 'input')",
    )
  return ToolCall(name, args)


def parse_tool_calls(text: str, tool_name: str = TOOL_NAME) -> list[ToolCall]:
  """Every `<tool_call>{json}</tool_call>` in `text`, in order (Hermes format, as the released rStar2 tool parser).

  A call whose JSON fails to parse, lacks name/arguments, names another tool or lacks a string
  `code` comes back with `.error` set to the message returned to the model.
  """
  return [_parse_one(m.group(1), tool_name) for m in _TOOL_CALL_RE.finditer(text)]


def format_tool_call(
  code: str, stdin: str = "", tool_name: str = TOOL_NAME, fields: tuple = ("code", "input")
) -> str:
  """The canonical text of one call as the assistant writes it (Hermes <tool_call> JSON);
  ``fields=("code",)`` for a code-only tool (`QWEN3_THINKING`)."""
  args = {"code": code, "input": stdin}
  return (
    "\n<tool_call>\n"
    + json.dumps({"name": tool_name, "arguments": {k: args[k] for k in fields}})
    + "\n</tool_call>"
  )


# ------------------------------------------------------------------------------- SFT rendering


@dataclasses.dataclass(frozen=True)
class RenderedChat:
  """prompt_ids [P]; response_ids [R]; loss_mask [R] (1 = assistant-written token)."""

  prompt_ids: list[int]
  response_ids: list[int]
  loss_mask: list[int]

  @property
  def input_ids(self) -> list[int]:
    return self.prompt_ids + self.response_ids

  @property
  def full_loss_mask(self) -> list[int]:
    return [0] * len(self.prompt_ids) + self.loss_mask


def _assistant_text(msg: Mapping[str, Any], where: str, fmt: ChatFormat = None) -> str:
  fmt = fmt or RSTAR2
  content = msg.get("content") or ""
  if not isinstance(content, str):
    raise TypeError(f"{where}: content must be a string, got {type(content).__name__}")
  prefill = fmt.generation_prompt[len("<|im_start|>assistant\n") :]
  if prefill and content.startswith(prefill):  # the prefill already holds it (<reason>, ...)
    content = content[len(prefill) :]
  for j, call in enumerate(msg.get("tool_calls") or ()):
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):
      args = json.loads(args)
    if "code" not in args:
      raise ValueError(f"{where}.tool_calls[{j}]: arguments lack 'code'")
    content += format_tool_call(
      args["code"], args.get("input", "") or "", fn.get("name", fmt.tool_name), fmt.call_fields
    )
  return content


def render_chat_ids(
  tokenizer,
  messages: Sequence[Mapping[str, Any]],
  system_prompt: str = SYSTEM_PROMPT,
  with_tools: bool = True,
  fmt: str | ChatFormat | None = None,
) -> RenderedChat:
  """Renders [system?] user (assistant tool+)* assistant into prompt/response ids + loss mask.

  Assistant content may start with "<reason>" (dropped: the prefill has it) and may carry
  OpenAI-style `tool_calls` (appended as <tool_call> blocks); `<|im_end|>` is appended to each
  assistant turn with mask 1. Consecutive `tool` messages become one tool turn (mask 0) built
  by `tool_turn_ids`, exactly as the agent loop appends them.

  ``fmt`` (a `FORMATS` name or `ChatFormat`) renders in that format instead, as the agent loop
  does with the same format (a system message then replaces the format's system text);
  ``system_prompt`` applies to the default format only; ``with_tools`` to every format.
  """
  msgs = list(messages)
  f = None if fmt is None else get_format(fmt)
  if msgs and msgs[0].get("role") == "system":
    system_prompt, msgs = msgs[0]["content"], msgs[1:]
    if f is not None:
      f = dataclasses.replace(f, system_prompt=system_prompt)
  if not msgs or msgs[0].get("role") != "user":
    raise ValueError(
      "render_chat_ids: messages must start with a user message "
      f"(after an optional system), got roles {[m.get('role') for m in messages]}"
    )
  prompt = (
    build_prompt_ids(tokenizer, msgs[0]["content"], system_prompt, with_tools)
    if f is None
    else prompt_ids(tokenizer, f, msgs[0]["content"], with_tools=with_tools)
  )
  im_end = stop_token_id(tokenizer)
  ids: list[int] = []
  mask: list[int] = []
  i = 1
  expect = "assistant"
  while i < len(msgs):
    role = msgs[i].get("role")
    where = f"messages[{i}]"
    if role != expect and not (expect == "assistant" and role is None):
      raise ValueError(f"{where}: expected role {expect!r}, got {role!r}")
    if role == "assistant":
      piece = _encode(tokenizer, _assistant_text(msgs[i], where, f)) + [im_end]
      ids += piece
      mask += [1] * len(piece)
      i += 1
      expect = "tool"
    else:
      texts = []
      while i < len(msgs) and msgs[i].get("role") == "tool":
        texts.append(str(msgs[i].get("content", "")))
        i += 1
      piece = (
        tool_turn_ids(tokenizer, texts) if f is None else format_tool_turn_ids(tokenizer, f, texts)
      )
      ids += piece
      mask += [0] * len(piece)
      expect = "assistant"
  if expect != "tool":
    raise ValueError("render_chat_ids: the conversation must end with an assistant message")
  return RenderedChat(prompt, ids, mask)


def chat_template() -> str:
  """A Jinja ChatML template equal to `build_prompt_text` / `render_chat_ids` text.

  `apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)` gives
  `build_prompt_text(q)`. Tool messages are wrapped in <tool_response> and merged.
  """

  def lit(s: str) -> str:  # every literal as an expression: immune to trim/lstrip_blocks
    return "{{ " + json.dumps(s) + " }}"

  return (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set sys = messages[0]['content'] -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set sys = " + json.dumps(SYSTEM_PROMPT) + " -%}"
    "{%- set rest = messages -%}{%- endif -%}"
    + lit("<|im_start|>system\n")
    + "{{ sys }}"
    + lit("\n\n" + TOOLS_BLOCK + "<|im_end|>\n")
    + "{%- for m in rest -%}"
    "{%- if m['role'] == 'user' -%}"
    + lit("<|im_start|>user\n" + USER_PREFIX)
    + "{{ m['content'] }}"
    + lit("<|im_end|>\n")
    + "{%- elif m['role'] == 'assistant' -%}"
    "{%- set c = m['content'] or '' -%}"
    "{%- if c.startswith('<reason>') -%}{%- set c = c[8:] -%}{%- endif -%}"
    + lit("<|im_start|>assistant\n<reason>")
    + "{{ c }}"
    "{%- for tc in m.get('tool_calls', []) or [] -%}"
    "{%- set f = tc['function'] if tc['function'] is defined else tc -%}"
    + lit('\n<tool_call>\n{"name": ')
    + "{{ f['name'] | tojson }}"
    + lit(', "arguments": ')
    + "{{ f['arguments'] | tojson }}"
    + lit("}\n</tool_call>")
    + "{%- endfor -%}"
    + lit("<|im_end|>\n")
    + "{%- elif m['role'] == 'tool' -%}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' -%}"
    + lit("<|im_start|>user\n")
    + "{%- else -%}"
    + lit("\n")
    + "{%- endif -%}"
    + lit("<tool_response>\n")
    + "{{ m['content'] }}"
    + lit("\n</tool_response>")
    + "{%- if loop.last or loop.nextitem['role'] != 'tool' -%}"
    + lit("<|im_end|>\n")
    + "{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}" + lit(GENERATION_PROMPT) + "{%- endif -%}"
  )
