"""rStar2-Agent / ASTER prompt and turn rendering, token-in/token-out.

Prompt  = <|im_start|>system\\n{system prompt}\\n\\n{Hermes tool block}<|im_end|>\\n
          <|im_start|>user\\n{user prefix}{question}<|im_end|>\\n
          {generation prompt}                       (rstar2: <|im_start|>assistant\\n<reason>)
The model writes an assistant turn and ends it with <|im_end|> (a stop token). A tool turn is
appended as the ids of a fixed template (loss mask 0); rstar2's leading "\\n" is ChatML's
newline after <|im_end|>. Several calls in one turn give one user turn with one
<tool_response> block per call (consecutive tool messages merge). Generated ids are never
decoded and re-encoded: the agent loop decodes only to parse tool calls.

One API, every function taking the format first (a `FORMATS` name or a `ChatFormat`):
  prompt_text / prompt_ids        the prompt of one question, ending with the prefill
  tool_turn_text / tool_turn_ids  the tool turn appended after an assistant <|im_end|>
  render_chat_ids                 a whole chat (messages) for SFT, with its loss mask
  chat_template                   the Jinja template that renders the same text (exports)
  stop_token_ids                  <|im_end|> plus the checkpoint's generation_config EOS ids
A trajectory written by the agent loop and the same conversation rendered for SFT agree token
for token (as long as the model's ids are the canonical encoding of its text), and
`apply_chat_template` with `chat_template(fmt)` gives the same text.

Formats:
  "rstar2"           this project's default: tool `execute_python_code_with_standard_io`,
                     shortened descriptions, tool turn led by ChatML's "\\n", `<reason>` prefill.
  "rstar2_released"  the released rStar2-Agent code (microsoft/rStar,
                     rstar2_agent/config/rstar2_agent_trainer.yaml custom_chat_template and
                     tool_config/python_tool_config.yaml): tool `python_code_with_standard_io`
                     with the released descriptions; the tool turn is appended right after the
                     assistant's <|im_end|> with no newline (verl's agent loop renders the tool
                     messages with the template and strips the system prefix).
  "qwen3_thinking"   ASTER: the Qwen3 thinking template (Qwen3-*-Thinking-2507: no system text
                     unless given, bare user turn, the generation prompt opens <think>, an
                     assistant turn is <think>\\n{reasoning}\\n</think>\\n\\n{content}) with a
                     stateful `code_interpreter` tool that takes only `code`.
  "qwen3"            the Qwen3 hybrid template in thinking mode (Qwen3-8B/14B/32B): the
                     generation prompt is a bare <|im_start|>assistant\\n and the model opens
                     <think> itself; same tool as "qwen3_thinking".
The Qwen3 formats are checked token for token against the Qwen3 templates in
tests/tokenization/test_qwen3_templates.py. See docs/fidelity.md.
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
TOOL_RESPONSE_BLOCK = "<tool_response>\n{text}\n</tool_response>"
IM_END = "<|im_end|>"
_ASSISTANT_HEAD = "<|im_start|>assistant\n"

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


# ------------------------------------------------------------------------------- formats

_TOOLS_HEAD = (
  "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_TAIL = (
  "\n</tools>\n\n"
  "For each function call, return a json object with function name and arguments "
  "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
  '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
THINKING = ("", "qwen3", "qwen3_thinking")


def _tools_block(schema: Mapping[str, Any]) -> str:
  """The Hermes tool block of the Qwen / rStar2 templates for one tool (HF's `tojson`)."""
  return _TOOLS_HEAD + "\n" + json.dumps(schema, ensure_ascii=False) + _TOOLS_TAIL


@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """One prompt / tool-turn layout.

  Attributes:
      name: registry name (`get_format`).
      tool_schema: the OpenAI-style function schema shown in the system turn.
      system_prompt: text before the tool block ("" = the tool block alone; with no tool
          block either, no system turn at all, as Qwen3's template).
      user_prefix: text put before the question in the user turn.
      generation_prompt: the assistant prefill ending the prompt and every tool turn.
      tool_turn_lead: text between the assistant's <|im_end|> and the tool turn's
          <|im_start|> ("\\n" = ChatML; "" = the released rStar2 loop).
      call_fields: argument names `format_tool_call` writes (("code", "input") or ("code",)).
      thinking: how an assistant turn holds its reasoning. "" = inline in the content after
          the prefill (rStar2's <reason>; a separate `reasoning_content` is refused);
          "qwen3_thinking" = always <think>\\n{r}\\n</think>\\n\\n{content} (Qwen3 thinking
          template); "qwen3" = the same, but a non-final turn without reasoning is its bare
          content (Qwen3 hybrid template).
  """

  name: str
  tool_schema: Mapping[str, Any]
  system_prompt: str
  user_prefix: str
  generation_prompt: str
  tool_turn_lead: str = "\n"
  call_fields: tuple = ("code", "input")
  thinking: str = ""

  def __post_init__(self):
    if self.thinking not in THINKING:
      raise ValueError(f"ChatFormat.thinking: expected one of {THINKING}, got {self.thinking!r}")

  @property
  def tool_name(self) -> str:
    return self.tool_schema["function"]["name"]

  @property
  def tools_block(self) -> str:
    return _tools_block(self.tool_schema)

  @property
  def prefill(self) -> str:
    """What the generation prompt puts after `<|im_start|>assistant\\n` ("<reason>", ...)."""
    return self.generation_prompt[len(_ASSISTANT_HEAD) :]


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
  thinking="qwen3_thinking",
)
QWEN3 = ChatFormat(
  "qwen3",
  _CODE_INTERPRETER_SCHEMA,
  "",
  "",
  "<|im_start|>assistant\n",
  call_fields=("code",),
  thinking="qwen3",
)
FORMATS = {f.name: f for f in (RSTAR2, RSTAR2_RELEASED, QWEN3_THINKING, QWEN3)}


def get_format(fmt: str | ChatFormat) -> ChatFormat:
  """A `ChatFormat` by name (or returned as is); ValueError lists the known names."""
  if isinstance(fmt, ChatFormat):
    return fmt
  if fmt not in FORMATS:
    raise ValueError(f"chat format must be one of {sorted(FORMATS)}, got {fmt!r}")
  return FORMATS[fmt]


# ------------------------------------------------------------------------------- prompts


def _encode(tokenizer, text: str) -> list[int]:
  return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


def _system_turn(f: ChatFormat, system_prompt: str | None, with_tools: bool) -> str:
  sp = f.system_prompt if system_prompt is None else system_prompt
  tools = f.tools_block if with_tools else ""
  system = sp + ("\n\n" if sp and tools else "") + tools
  return f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""


def prompt_text(
  fmt: str | ChatFormat, question: str, system_prompt: str | None = None, with_tools: bool = True
) -> str:
  """The rendered prompt of ``question`` in format ``fmt`` (ends with its prefill).

  ``system_prompt`` replaces the format's system text (None = the format's); ``with_tools``
  False leaves the tool block out. An empty system text with no tool block renders no system
  turn (Qwen3's template).
  """
  f = get_format(fmt)
  if not isinstance(question, str):
    raise TypeError(f"prompt_text: question must be str, got {type(question).__name__}")
  return (
    _system_turn(f, system_prompt, with_tools)
    + f"<|im_start|>user\n{f.user_prefix}{question}<|im_end|>\n{f.generation_prompt}"
  )


def prompt_ids(
  tokenizer,
  fmt: str | ChatFormat,
  question: str,
  system_prompt: str | None = None,
  with_tools: bool = True,
) -> list[int]:
  """Prompt token ids [P] of ``question`` (`prompt_text`)."""
  return _encode(tokenizer, prompt_text(fmt, question, system_prompt, with_tools))


def tool_turn_text(fmt: str | ChatFormat, texts: str | Sequence[str]) -> str:
  """The tool turn of ``fmt`` for one or several tool-response bodies, ending in the prefill."""
  f = get_format(fmt)
  texts = [texts] if isinstance(texts, str) else list(texts)
  if not texts:
    raise ValueError("tool_turn_text: no tool response texts")
  blocks = "\n".join(TOOL_RESPONSE_BLOCK.format(text=t) for t in texts)
  return f.tool_turn_lead + "<|im_start|>user\n" + blocks + "<|im_end|>\n" + f.generation_prompt


def tool_turn_ids(tokenizer, fmt: str | ChatFormat, texts: str | Sequence[str]) -> list[int]:
  """Ids of the tool turn appended after an assistant `<|im_end|>` (all loss mask 0)."""
  return _encode(tokenizer, tool_turn_text(fmt, texts))


def stop_token_id(tokenizer) -> int:
  """The id of `<|im_end|>`, which ends every assistant turn."""
  tid = tokenizer.convert_tokens_to_ids(IM_END)
  if tid is None or tid == getattr(tokenizer, "unk_token_id", -1):
    raise ValueError(f"tokenizer has no {IM_END} token")
  return int(tid)


def pad_id_of(tokenizer) -> int:
  """The id padding columns hold: the tokenizer's pad id, else its EOS id, else 0 (padding is
  masked out everywhere, so only its range matters)."""
  for attr in ("pad_token_id", "eos_token_id"):
    v = getattr(tokenizer, attr, None)
    if isinstance(v, int):
      return v
  return 0


GENERATION_CONFIG = "generation_config.json"


def generation_config_eos_ids(model_dir: str) -> tuple[int, ...]:
  """The ``eos_token_id`` ids of ``model_dir``/generation_config.json (an int or a list);
  () when the directory or the file is absent. A malformed file is a one-line ValueError."""
  import os

  path = os.path.join(model_dir, GENERATION_CONFIG) if model_dir else ""
  if not path or not os.path.isfile(path):
    return ()
  try:
    with open(path) as fh:
      eos = json.load(fh).get("eos_token_id")
  except (OSError, ValueError, AttributeError) as e:
    raise ValueError(f"{path}: not a JSON object ({e})") from None
  eos = [] if eos is None else [eos] if isinstance(eos, int) else eos
  if not isinstance(eos, list) or not all(isinstance(t, int) and t >= 0 for t in eos):
    raise ValueError(f"{path}: eos_token_id: expected an id or a list of ids, got {eos!r}")
  return tuple(eos)


def stop_token_ids(tokenizer, model_dir: str = "") -> tuple[int, ...]:
  """The ids that end an assistant turn: `<|im_end|>` first, then every EOS id of the
  checkpoint's generation_config.json (``model_dir``; Qwen3 lists <|im_end|> and
  <|endoftext|>), without repeats. What the agent loop stops on and what the export writes."""
  out = [stop_token_id(tokenizer)]
  vocab = len(tokenizer)
  for t in generation_config_eos_ids(model_dir):
    if t >= vocab:
      raise ValueError(
        f"{model_dir}/{GENERATION_CONFIG}: eos_token_id {t} is outside the tokenizer's {vocab} ids"
      )
    if t not in out:
      out.append(t)
  return tuple(out)


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
    + json.dumps({"name": tool_name, "arguments": {k: args[k] for k in fields}}, ensure_ascii=False)
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


def _call_args(call: Mapping[str, Any], where: str) -> tuple[Mapping[str, Any], Any]:
  """(function, parsed arguments) of one OpenAI-style tool call; the code must be there."""
  fn = call.get("function", call)
  args = fn.get("arguments", {})
  parsed = json.loads(args) if isinstance(args, str) else args
  if not isinstance(parsed, Mapping) or "code" not in parsed:
    raise ValueError(f"{where}: arguments lack 'code'")
  return fn, parsed


def _qwen3_call(fn: Mapping[str, Any], tool_name: str) -> str:
  """One call as Qwen3's template writes it (string arguments verbatim, else HF `tojson`)."""
  args = fn.get("arguments", {})
  args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
  return (
    f'<tool_call>\n{{"name": "{fn.get("name", tool_name)}", "arguments": {args}}}\n</tool_call>'
  )


def _assistant_body(msg: Mapping[str, Any], where: str, f: ChatFormat, last: bool) -> str:
  """The text of one assistant turn after `<|im_start|>assistant\\n`, up to its <|im_end|>."""
  content = msg.get("content") or ""
  if not isinstance(content, str):
    raise TypeError(f"{where}: content must be a string, got {type(content).__name__}")
  reasoning = msg.get("reasoning_content")
  if reasoning is not None and not isinstance(reasoning, str):
    raise TypeError(f"{where}.reasoning_content: expected a string, got {type(reasoning).__name__}")
  calls = list(msg.get("tool_calls") or ())
  if not f.thinking:
    if reasoning:
      raise ValueError(
        f"{where}.reasoning_content: format {f.name!r} keeps the reasoning inline in the "
        f"content after {f.prefill!r}; merge it into 'content' or use a Qwen3 format"
      )
    if f.prefill and content.startswith(f.prefill):  # the prefill already holds it
      content = content[len(f.prefill) :]
    body = f.prefill + content
    for j, call in enumerate(calls):
      fn, args = _call_args(call, f"{where}.tool_calls[{j}]")
      body += format_tool_call(
        args["code"], args.get("input", "") or "", fn.get("name", f.tool_name), f.call_fields
      )
    return body
  # Qwen3's templates, rule for rule: the reasoning is `reasoning_content`, else what precedes
  # </think> in the content; the thinking block is written unless this is a hybrid-template
  # turn that is neither the last nor has reasoning.
  if reasoning is None:
    reasoning = ""
    if "</think>" in content:
      reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
      content = content.split("</think>")[-1].lstrip("\n")
  if f.thinking == "qwen3_thinking" or last or reasoning:
    body = "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n")
  else:
    body = content
  for j, call in enumerate(calls):
    fn, _ = _call_args(call, f"{where}.tool_calls[{j}]")
    body += ("\n" if content or j else "") + _qwen3_call(fn, f.tool_name)
  return body


def render_chat_ids(
  tokenizer,
  messages: Sequence[Mapping[str, Any]],
  system_prompt: str | None = None,
  with_tools: bool = True,
  fmt: str | ChatFormat | None = None,
) -> RenderedChat:
  """Renders [system?] user (assistant tool+)* assistant into prompt/response ids + loss mask.

  ``fmt`` (a `FORMATS` name or `ChatFormat`; None = "rstar2") is the layout, as the agent
  loop renders it; a system message, else ``system_prompt`` (None = the format's), is the
  system text; ``with_tools`` puts the format's tool block in. Assistant turns may carry
  OpenAI-style `tool_calls` (written as <tool_call> blocks) and, in the Qwen3 formats,
  `reasoning_content` (or <think>...</think> inline), rendered as Qwen3's templates do; an
  rstar2 content may start with the "<reason>" prefill. `<|im_end|>` ends each assistant turn
  with mask 1. Consecutive `tool` messages become one tool turn (mask 0) built by
  `tool_turn_ids`, exactly as the agent loop appends them. The text equals
  `apply_chat_template(messages)` with `chat_template(fmt)` minus the final newline.
  """
  msgs = list(messages)
  f = get_format("rstar2" if fmt is None else fmt)
  if msgs and msgs[0].get("role") == "system":
    system_prompt, msgs = msgs[0]["content"], msgs[1:]
  if not msgs or msgs[0].get("role") != "user":
    raise ValueError(
      "render_chat_ids: messages must start with a user message "
      f"(after an optional system), got roles {[m.get('role') for m in messages]}"
    )
  prompt = prompt_ids(tokenizer, f, msgs[0]["content"], system_prompt, with_tools)
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
      body = _assistant_body(msgs[i], where, f, last=i == len(msgs) - 1)
      # The prompt / tool turn already holds the prefill; the model writes the rest.
      piece = _encode(tokenizer, body[len(f.prefill) :]) + [im_end]
      ids += piece
      mask += [1] * len(piece)
      i += 1
      expect = "tool"
    else:
      texts = []
      while i < len(msgs) and msgs[i].get("role") == "tool":
        texts.append(str(msgs[i].get("content", "")))
        i += 1
      piece = tool_turn_ids(tokenizer, f, texts)
      ids += piece
      mask += [0] * len(piece)
      expect = "assistant"
  if expect != "tool":
    raise ValueError("render_chat_ids: the conversation must end with an assistant message")
  return RenderedChat(prompt, ids, mask)


# ------------------------------------------------------------------------------- Jinja template


def _lit(s: str) -> str:
  """A literal as a Jinja expression: immune to trim_blocks / lstrip_blocks."""
  return "{{ " + json.dumps(s) + " }}"


def chat_template(
  fmt: str | ChatFormat = "rstar2", system_prompt: str | None = None, with_tools: bool = True
) -> str:
  """A Jinja chat template that renders format ``fmt`` as this module does.

  With ``system_prompt`` / ``with_tools`` as the run used them,
  `apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)` gives
  `prompt_text(fmt, q, system_prompt, with_tools)`, and a whole chat gives `render_chat_ids`'
  text plus the final newline. A `tools` argument replaces the trained tool block; a system
  message replaces the system text. The Qwen3 formats follow Qwen3's templates (reasoning
  written as <think> blocks only after the last user query, string tool arguments verbatim);
  an rstar2 assistant message with `reasoning_content` is an error, as in `render_chat_ids`.
  """
  f = get_format(fmt)
  sp = f.system_prompt if system_prompt is None else system_prompt
  q = json.dumps
  t = [
    "{%- set sys = " + q(sp) + " -%}{%- set rest = messages -%}",
    "{%- if messages and messages[0]['role'] == 'system' -%}",
    "{%- set sys = messages[0]['content'] -%}{%- set rest = messages[1:] -%}{%- endif -%}",
    "{%- if tools is defined and tools -%}",
    "{%- set ns = namespace(tb=" + q(_TOOLS_HEAD) + ") -%}",
    "{%- for tl in tools -%}{%- set ns.tb = ns.tb + '\\n' + (tl | tojson) -%}{%- endfor -%}",
    "{%- set tb = ns.tb + " + q(_TOOLS_TAIL) + " -%}",
    "{%- else -%}{%- set tb = " + q(f.tools_block if with_tools else "") + " -%}{%- endif -%}",
    "{%- if sys and tb -%}{%- set sys = sys + '\\n\\n' + tb -%}",
    "{%- elif tb -%}{%- set sys = tb -%}{%- endif -%}",
    "{%- if sys -%}" + _lit("<|im_start|>system\n") + "{{ sys }}" + _lit("<|im_end|>\n"),
    "{%- endif -%}",
    # Qwen3: the index of the last real user query (tool responses sent as user text skipped).
    "{%- set ns2 = namespace(last_query=rest | length - 1, multi=true) -%}",
    "{%- for m in rest[::-1] -%}",
    "{%- if ns2.multi and m['role'] == 'user' and m['content'] is string and not "
    "(m['content'].startswith('<tool_response>') and m['content'].endswith('</tool_response>'))"
    " -%}",
    "{%- set ns2.multi = false -%}{%- set ns2.last_query = rest | length - 1 - loop.index0 -%}",
    "{%- endif -%}{%- endfor -%}",
    "{%- for m in rest -%}",
    "{%- set content = m['content'] if m['content'] is string else '' -%}",
    "{%- if m['role'] == 'user' -%}",
    _lit("<|im_start|>user\n" + f.user_prefix) + "{{ content }}" + _lit("<|im_end|>\n"),
    "{%- elif m['role'] == 'system' -%}",
    _lit("<|im_start|>system\n") + "{{ content }}" + _lit("<|im_end|>\n"),
    "{%- elif m['role'] == 'assistant' -%}",
  ]
  if f.thinking:
    show = "true" if f.thinking == "qwen3_thinking" else "(loop.last or r)"
    t += [
      "{%- set r = '' -%}",
      "{%- if m.reasoning_content is string -%}{%- set r = m.reasoning_content -%}",
      "{%- elif '</think>' in content -%}",
      "{%- set r = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1]"
      ".lstrip('\\n') -%}",
      "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}",
      "{%- if loop.index0 > ns2.last_query and " + show + " -%}",
      _lit("<|im_start|>assistant\n<think>\n")
      + "{{ r.strip('\\n') }}"
      + _lit("\n</think>\n\n")
      + "{{ content.lstrip('\\n') }}",
      "{%- else -%}" + _lit("<|im_start|>assistant\n") + "{{ content }}{%- endif -%}",
      "{%- for tc in m.tool_calls or [] -%}",
      "{%- if (loop.first and content) or not loop.first -%}" + _lit("\n") + "{%- endif -%}",
      "{%- set fn = tc.function if tc.function is defined else tc -%}",
      _lit('<tool_call>\n{"name": "') + "{{ fn.name }}" + _lit('", "arguments": '),
      "{%- if fn.arguments is string -%}{{ fn.arguments }}",
      "{%- else -%}{{ fn.arguments | tojson }}{%- endif -%}",
      _lit("}\n</tool_call>"),
      "{%- endfor -%}",
    ]
  else:
    n = len(f.prefill)
    t += [
      "{%- if m.reasoning_content is string and m.reasoning_content -%}",
      "{{ raise_exception("
      + q(f"format {f.name!r} keeps the reasoning inline in the content after {f.prefill!r}")
      + ") }}{%- endif -%}",
      "{%- if content.startswith(" + q(f.prefill) + ") -%}",
      "{%- set content = content[" + str(n) + ":] -%}{%- endif -%}",
      _lit("<|im_start|>assistant\n" + f.prefill) + "{{ content }}",
      "{%- for tc in m.tool_calls or [] -%}",
      "{%- set fn = tc.function if tc.function is defined else tc -%}",
      _lit('\n<tool_call>\n{"name": ')
      + "{{ fn.name | tojson }}"
      + _lit(', "arguments": ')
      + "{{ fn.arguments | tojson }}"
      + _lit("}\n</tool_call>"),
      "{%- endfor -%}",
    ]
  t.append(_lit("<|im_end|>"))
  if f.tool_turn_lead:
    t.append(_lit("\n"))
  else:  # the released loop appends the tool turn right after <|im_end|>
    t.append(
      "{%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' -%}"
      + _lit("\n")
      + "{%- endif -%}"
    )
  t += [
    "{%- elif m['role'] == 'tool' -%}",
    "{%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' -%}"
    + _lit("<|im_start|>user\n")
    + "{%- else -%}"
    + _lit("\n")
    + "{%- endif -%}",
    _lit("<tool_response>\n") + "{{ content }}" + _lit("\n</tool_response>"),
    "{%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' -%}"
    + _lit("<|im_end|>\n")
    + "{%- endif -%}",
    "{%- endif -%}{%- endfor -%}",
    "{%- if add_generation_prompt -%}" + _lit(f.generation_prompt),
  ]
  if f.thinking == "qwen3":  # the hybrid template's non-thinking switch
    t.append(
      "{%- if enable_thinking is defined and enable_thinking is false -%}"
      + _lit("<think>\n\n</think>\n\n")
      + "{%- endif -%}"
    )
  t.append("{%- endif -%}")
  return "".join(t)
