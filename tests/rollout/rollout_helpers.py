"""Shared helpers for the rollout tests: a tiny trained tokenizer, a scripted engine, a fake pool."""

import asyncio
import re

from rstar_jax.rollout.types import GenerateResult
from rstar_jax.tokenization import chat_format
from rstar_jax.tokenization.bpe import train_bpe_tokenizer
from rstar_jax.tools.code_pool import ExecResult

CORPUS = [
  chat_format.SYSTEM_PROMPT,
  chat_format.TOOLS_BLOCK,
  chat_format.USER_PREFIX,
  "Let me compute this with python.\n" + chat_format.format_tool_call("print(2+2)"),
  "Tool call success\nstdout: 4\nexecution time: 0.01s",
  "So the answer is 4.</reason><answer>\\boxed{4}</answer>",
  "def f(n):\n    return sum(range(n))\nprint(f(10))\n",
] * 4


def make_tokenizer(out_dir=None, vocab_size=512):
  return train_bpe_tokenizer(CORPUS, vocab_size, out_dir)


def call_text(code, stdin=""):
  return "I will run code." + chat_format.format_tool_call(code, stdin)


class ScriptedEngine:
  """Returns predetermined assistant turns (text -> ids + <|im_end|>) per trajectory.

  script(question_prompt_ids, turn_index) -> text, or None to emit an unterminated turn.
  Honours max_new_tokens (finish "length"), records every request, and yields to the loop
  for `delay_s` so concurrent trajectories interleave.
  """

  def __init__(self, tokenizer, script, delay_s=0.0, version=3, logprob=-0.5):
    self.tok, self.script, self.delay_s = tokenizer, script, delay_s
    self.requests, self._version, self.logprob = [], version, logprob
    self.im_end = chat_format.stop_token_id(tokenizer)
    self.events = []

  @property
  def weight_version(self):
    return self._version

  async def update_weights(self, config, params, version=None):
    self._version = version

  async def generate(self, requests):
    out = []
    for r in requests:
      self.requests.append(r)
      turn = int(r.rid.rsplit(":", 1)[1])
      self.events.append(("start", r.rid))
      await asyncio.sleep(self.delay_s)
      text = self.script(r, turn)
      ids = self.tok.encode(text, add_special_tokens=False) + [self.im_end]
      n = r.sampling.max_new_tokens
      reason = "stop" if len(ids) <= n else "length"
      ids = ids[:n]
      self.events.append(("end", r.rid))
      out.append(GenerateResult(ids, [self.logprob] * len(ids), reason, self._version))
    return out


class FakePool:
  """CodePool contract stand-in: answers `print(A+B)` (ints), anything else is an error."""

  def __init__(self, delay_s=0.0, status=None, raise_exc=None):
    self.delay_s, self.status, self.raise_exc = delay_s, status, raise_exc
    self.calls = []

  async def execute(self, code, stdin="", timeout_s=None, session_id=None):
    self.calls.append((code, stdin, timeout_s, session_id))
    await asyncio.sleep(self.delay_s)
    if self.raise_exc is not None:
      raise self.raise_exc
    if self.status is not None:
      return ExecResult(self.status, "", "boom", 0.25)
    m = re.fullmatch(r"print\((\d+)\+(\d+)\)", code.strip())
    if m:
      return ExecResult("ok", f"{int(m.group(1)) + int(m.group(2))}\n", "", 0.01)
    return ExecResult("error", "", "NameError: name is not defined", 0.01)
