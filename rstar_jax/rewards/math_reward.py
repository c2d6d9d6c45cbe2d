"""Answer-only outcome reward: extract the final \\boxed{} answer and check it against the gold.

    extract_answer(text, mode="answer_tag")  # last \\boxed{} inside the last <answer>...</answer>
    extract_released(text)                   # prime_math-style rules of the released reward
    is_equivalent(pred, gold)                # integer fast path, else math-verify out of process
    score(response_text, gold, mode=...)     # 1.0 or 0.0

Score modes: "answer_tag" (paper: last \\boxed{} in the last <answer>), "anywhere" (last
\\boxed{} anywhere) and "released": the released rStar2-Agent reward (microsoft/rStar,
fused_compute_score/__init__.py), which pays when EITHER the prime_math-style extraction over
the whole decoded response (tool outputs included) is equivalent to the gold, OR math-verify
reading the whole response finds the gold (`verify_worker.verify_text`). See docs/fidelity.md.

Equivalence never runs math-verify in the caller's process: sympy can hang on inputs such as a
power tower, and math-verify's own timeouts use signal.alarm (main thread only). A small
persistent worker process (`Verifier`) answers requests over a pipe and is killed and replaced
when one exceeds ``timeout_s``, which then scores 0. `score_async` can instead use any function
runner with the code pool's ``run_function(fn, *args, timeout_s=...)`` signature.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import queue
import re
import select
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from rstar_jax.rewards import verify_worker

EXTRACT_MODES = ("answer_tag", "anywhere")
SCORE_MODES = ("answer_tag", "anywhere", "released")
DEFAULT_TIMEOUT_S = 5.0
MAX_ANSWER_CHARS = 4096  # longer "answers" are not answers; refuse before parsing
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")

Runner = Callable[..., Awaitable[Any]]
log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- extraction
def _braced(text: str, start: int) -> str | None:
  """Body of the {...} group opening at text[start] == '{'; None when unbalanced.

  Escaped braces (\\{ \\}) are content, not grouping (sets like \\{1,2\\})."""
  depth, i = 0, start
  while i < len(text):
    c = text[i]
    if c == "\\":
      i += 2
      continue
    if c == "{":
      depth += 1
    elif c == "}":
      depth -= 1
      if depth == 0:
        return text[start + 1 : i]
    i += 1
  return None


def _last_boxed(text: str) -> str | None:
  matches = list(_BOX_RE.finditer(text))
  if not matches:
    return None
  j = matches[-1].end()
  while j < len(text) and text[j] == " ":
    j += 1
  if j < len(text) and text[j] == "{":
    body = _braced(text, j)
  else:  # "\boxed 5" form: one whitespace-free token
    m = re.match(r"[^\s$]+", text[j:])
    body = m.group(0) if m else None
  body = body.strip() if body is not None else None
  return body or None


def extract_answer(text: str, mode: str = "answer_tag") -> str | None:
  """The final answer's LaTeX body, or None.

  answer_tag (paper): the last \\boxed{...} inside the last <answer> block (an <answer> left
      open by truncation runs to the end of the text).
  anywhere (released code): the last \\boxed{...} anywhere in the text.
  Nested braces are matched; an unbalanced final \\boxed{ gives None.
  """
  if mode not in EXTRACT_MODES:
    raise ValueError(f"extract_answer: mode must be one of {EXTRACT_MODES}, got {mode!r}")
  if mode == "answer_tag":
    start = text.rfind("<answer>")
    if start < 0:
      return None
    start += len("<answer>")
    end = text.find("</answer>", start)
    text = text[start:] if end < 0 else text[start:end]
  return _last_boxed(text)


# The released reward decodes with skip_special_tokens=True; our trajectories keep ChatML
# specials in response_text, so "released" drops them first (an "<|im_end|>" glued to the
# answer would otherwise end up inside the extracted string).
_CHATML_SPECIAL = re.compile(r"<\|[A-Za-z_]+\|>")
# Markers of the released (PRIME / PRM800K-style) extraction, in the order they apply.
_LEAD_MARKERS = ("answer:", "answer is", "answers are")  # keep what follows
_TRAIL_MARKERS = ("is answer", "is the answer", "are answers", "are the answers")  # keep before
_TAIL_MARKERS = (
  "be ",
  "is ",
  "are ",
  "=",
  ": ",
  "get ",
  "be\n",
  "is\n",
  "are\n",
  ":\n",
  "get\n",
)  # keep what follows


def _released_boxed(text: str) -> str | None:
  """Body of the last \\boxed (else last \\fbox): the first '{' after it, brace-balanced.

  Unlike `_last_boxed`, escaped braces count as braces and "\\boxed 5" gives None: this is
  the released rule, kept as is so the reward matches it."""
  idx = text.rfind("\\boxed")
  if idx < 0:
    idx = text.rfind("\\fbox")
    if idx < 0:
      return None
  start = text.find("{", idx)
  if start < 0:
    return None
  depth = 0
  for i in range(start, len(text)):
    if text[i] == "{":
      depth += 1
    elif text[i] == "}":
      depth -= 1
      if depth == 0:
        return text[start + 1 : i].strip()
  return None


def extract_released(text: str) -> tuple[bool, str]:
  """The released reward's answer extraction: (matched, candidate).

  Rules, applied in order to the running candidate (initially the whole text), each marker
  searched case-insensitively at its LAST occurrence:
    1. after "answer:", "answer is", "answers are" (each in turn);
    2. before "is answer", "is the answer", "are answers", "are the answers";
    3. the body of the last \\boxed{...} (else \\fbox{...}), when non-empty;
    4. up to the last ". " (drops a trailing sentence);
    5. after "be ", "is ", "are ", "=", ": ", "get " (and the newline variants), each in turn;
  a marker or box found sets ``matched``, and a candidate without any digit is unmatched.
  The released grader scores the candidate whether or not it matched; so does `score`.
  """
  matched = False
  cand = text
  for m in _LEAD_MARKERS:
    i = cand.lower().rfind(m)
    if i != -1:
      matched, cand = True, cand[i + len(m) :].strip()
  for m in _TRAIL_MARKERS:
    i = cand.lower().rfind(m)
    if i != -1:
      matched, cand = True, cand[:i].strip()
  boxed = _released_boxed(cand)
  if boxed:
    matched, cand = True, boxed
  i = cand.rfind(". ")
  if i != -1:
    cand = cand[:i].strip()
  for m in _TAIL_MARKERS:
    i = cand.lower().rfind(m)
    if i != -1:
      matched, cand = True, cand[i + len(m) :].strip()
  return matched and any(c.isdigit() for c in cand), cand


# "\boxed" / "\frac" / "\fbox" typed into a non-raw Python string arrive as a backspace or
# form-feed followed by "oxed" / "rac" / "box". Neither control character occurs in decoded
# model text, so putting the backslash back changes no real score (a project addition, not
# released behaviour: see docs/fidelity.md).
_MANGLED_ESCAPES = ((re.compile("\x08(?=oxed)"), "\\b"), (re.compile("\x0c(?=rac|box)"), "\\f"))


def released_text(response_text: str) -> str:
  """The text the released reward reads: the response without ChatML special tokens (and
  with escape-mangled \\boxed / \\frac / \\fbox repaired)."""
  text = _CHATML_SPECIAL.sub("", response_text)
  for pat, rep in _MANGLED_ESCAPES:
    text = pat.sub(lambda _, r=rep: r, text)  # a function: re would read "\\b" as a backspace
  return text


# ----------------------------------------------------------------------------- integers
_INT_RE = re.compile(r"[+-]?(\d+|\d{1,3}(,\d{3})+)")


def as_integer(answer: str) -> int | None:
  """The integer an answer string spells (``1,000``, ``007``, ``+5``, ``$-3$``), else None."""
  s = answer.strip().strip("$").strip()
  s = s.replace("{,}", ",").replace("\\!", "").replace("\\,", "").replace(" ", "")
  s = s.replace("\u2212", "-")
  if s.startswith("{") and s.endswith("}"):
    s = s[1:-1]
  if not _INT_RE.fullmatch(s):
    return None
  return int(s.replace(",", ""))


# ----------------------------------------------------------------------------- worker
class _Worker:
  """One persistent verify_worker.py process; not thread-safe (the Verifier serialises)."""

  def __init__(self, startup_timeout_s: float):
    self._startup_timeout_s = startup_timeout_s
    self._proc: subprocess.Popen | None = None
    self.last_error = ""

  def _start(self) -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    # The parent's import path, so a user's registered verifier ("module:qualname") imports
    # in the worker as it did here (config `reward.imports` may have added the cwd).
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    self._proc = subprocess.Popen(
      [sys.executable, verify_worker.__file__],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL,
      text=True,
      bufsize=1,
      env=env,
      start_new_session=True,
    )
    if self._read(self._startup_timeout_s) is None:
      self.kill()
      raise RuntimeError(
        f"math_reward: verify worker did not start within {self._startup_timeout_s} s"
      )

  def _read(self, timeout_s: float) -> dict | None:
    assert self._proc is not None and self._proc.stdout is not None
    ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
    if not ready:
      return None
    line = self._proc.stdout.readline()
    return json.loads(line) if line else None

  def verify(
    self, pred: str, gold: str, timeout_s: float, kind: str = "answer", root: str | None = None
  ) -> bool | None:
    """True/False, or None on timeout or crash (the process is then killed)."""
    if self._proc is None or self._proc.poll() is not None:
      self._start()
    req = {"pred": pred, "gold": gold, "kind": kind}
    if root:
      req["root"] = root
    try:
      self._proc.stdin.write(json.dumps(req) + "\n")
      self._proc.stdin.flush()
      reply = self._read(timeout_s)
    except (BrokenPipeError, OSError, ValueError):
      reply = None
    if reply is None:
      self.kill()
      return None
    if reply.get("error"):
      self.last_error = reply["error"]
    return bool(reply["ok"])

  def kill(self) -> None:
    if self._proc is not None:
      try:
        os.killpg(self._proc.pid, 9)
      except (ProcessLookupError, PermissionError):
        pass
      self._proc.wait()
      for f in (self._proc.stdin, self._proc.stdout):
        try:
          f.close()
        except OSError:
          pass
      self._proc = None


class Verifier:
  """A few persistent math-verify worker processes with a hard per-call time bound.

  Thread-safe: each call borrows an idle worker. A call that exceeds ``timeout_s`` kills its
  worker (a fresh one starts on the next call) and counts as not equivalent.
  """

  def __init__(
    self,
    num_workers: int = 1,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    startup_timeout_s: float = 120.0,
  ):
    if num_workers < 1:
      raise ValueError(f"Verifier: num_workers must be >= 1, got {num_workers}")
    self.timeout_s = timeout_s
    self.num_timeouts = 0
    self.num_errors = 0
    self._idle: queue.Queue[_Worker] = queue.Queue()
    self._all = [_Worker(startup_timeout_s) for _ in range(num_workers)]
    for w in self._all:
      self._idle.put(w)

  def verify(
    self,
    pred: str,
    gold: str,
    timeout_s: float | None = None,
    *,
    kind: str = "answer",
    root: str | None = None,
  ) -> bool:
    """kind "answer": ``pred`` is an answer body; "text": a whole response searched by
    math-verify (`verify_worker.verify_text`); "module:qualname": a registered verifier
    (`rewards.registry`), whose exceptions score False and are counted in ``num_errors``;
    ``root`` is the folder its module imports from (a worker started before the module was
    importable, e.g. before a chdir, still finds it)."""
    w = self._idle.get()
    try:
      w.last_error = ""
      ok = w.verify(pred, gold, self.timeout_s if timeout_s is None else timeout_s, kind, root)
      err = w.last_error
    finally:
      self._idle.put(w)
    if err:
      self.num_errors += 1
      if self.num_errors <= 3:  # a broken verifier fails every call: say why, not 10^4 times
        log.warning("verifier %s failed (scored 0): %s", kind, err)
    if ok is None:
      self.num_timeouts += 1
      return False
    return ok

  def close(self) -> None:
    for w in self._all:
      w.kill()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


_default: Verifier | None = None
_default_lock = threading.Lock()


def default_verifier() -> Verifier:
  """The process-wide Verifier (one worker), started on first use and closed at exit."""
  global _default
  with _default_lock:
    if _default is None:
      _default = Verifier()
      atexit.register(_default.close)
    return _default


# ----------------------------------------------------------------------------- equivalence
def _precheck(pred: str | None, gold: str, max_chars: int) -> bool | None:
  """Decides cheap cases: False for missing/oversized answers, the integer fast path."""
  if pred is None or not pred.strip() or len(pred) > max_chars:
    return False
  ip, ig = as_integer(pred), as_integer(gold)
  if ip is not None and ig is not None:
    return ip == ig
  if pred.strip() == gold.strip():
    return True
  return None


def is_equivalent(
  pred: str | None,
  gold: str,
  timeout_s: float = DEFAULT_TIMEOUT_S,
  *,
  verifier: Verifier | None = None,
  max_chars: int = MAX_ANSWER_CHARS,
) -> bool:
  """Whether answer ``pred`` equals ``gold`` (both LaTeX answer bodies, no \\boxed).

  Integers (commas, leading zeros, signs) compare exactly in-process; everything else goes
  to math-verify (gold and pred each parsed as ``\\boxed{...}``) in a worker process,
  bounded by ``timeout_s``; a timeout is False. Answers longer than ``max_chars`` are False.
  """
  decided = _precheck(pred, gold, max_chars)
  if decided is not None:
    return decided
  return (verifier or default_verifier()).verify(pred, gold, timeout_s)


def _check_score_mode(fn: str, mode: str) -> None:
  if mode not in SCORE_MODES:
    raise ValueError(f"{fn}: mode must be one of {SCORE_MODES}, got {mode!r}")


def score(
  response_text: str,
  gold: str,
  *,
  mode: str = "answer_tag",
  timeout_s: float = DEFAULT_TIMEOUT_S,
  verifier: Verifier | None = None,
) -> float:
  """1.0 if the response's final answer is equivalent to ``gold``, else 0.0.

  answer_tag / anywhere: `extract_answer` then `is_equivalent`.
  released: the released rStar2-Agent reward: `extract_released` over the whole response
      (specials dropped) judged by `is_equivalent`, OR math-verify over the whole response
      (`verify_worker.verify_text`); either one pays. The released code grades the extracted
      candidate with PRM800K normalisation + sympy; here the project's `is_equivalent`
      (integer fast path + math-verify) judges it.
  """
  _check_score_mode("score", mode)
  if mode != "released":
    pred = extract_answer(response_text, mode)
    return 1.0 if is_equivalent(pred, gold, timeout_s, verifier=verifier) else 0.0
  text = released_text(response_text)
  _, cand = extract_released(text)
  if is_equivalent(cand, gold, timeout_s, verifier=verifier):
    return 1.0
  v = verifier or default_verifier()
  return 1.0 if v.verify(text, gold, timeout_s, kind="text") else 0.0


async def score_async(
  response_text: str,
  gold: str,
  runner: Runner | None = None,
  *,
  mode: str = "answer_tag",
  timeout_s: float = DEFAULT_TIMEOUT_S,
  verifier: Verifier | None = None,
) -> float:
  """`score` for asyncio code.

  With ``runner`` (e.g. ``CodePool.run_function``) math-verify runs as
  ``await runner(verify_worker.verify_strings, pred, gold, timeout_s=timeout_s)`` (and
  ``verify_worker.verify_text`` for the released whole-text check); any exception the runner
  raises (timeout, memory limit, ...) scores 0. Without it the `Verifier` is used from a
  thread so the event loop never blocks.
  """
  _check_score_mode("score_async", mode)
  if runner is None:
    v = verifier or default_verifier()
    if mode == "released":
      return await asyncio.to_thread(
        score, response_text, gold, mode=mode, timeout_s=timeout_s, verifier=v
      )
    pred = extract_answer(response_text, mode)
    decided = _precheck(pred, gold, MAX_ANSWER_CHARS)
    if decided is not None:
      return float(decided)
    ok = await asyncio.to_thread(v.verify, pred, gold, timeout_s)
    return float(ok)

  async def run(fn, a, b) -> bool:
    try:
      return (await runner(fn, a, b, timeout_s=timeout_s)) is True
    except Exception:
      return False

  if mode == "released":
    text = released_text(response_text)
    _, cand = extract_released(text)
    decided = _precheck(cand, gold, MAX_ANSWER_CHARS)
    if decided or (decided is None and await run(verify_worker.verify_strings, cand, gold)):
      return 1.0
    return 1.0 if await run(verify_worker.verify_text, text, gold) else 0.0
  pred = extract_answer(response_text, mode)
  decided = _precheck(pred, gold, MAX_ANSWER_CHARS)
  if decided is not None:
    return float(decided)
  return 1.0 if await run(verify_worker.verify_strings, pred, gold) else 0.0
