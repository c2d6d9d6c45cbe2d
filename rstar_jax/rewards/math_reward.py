"""Answer-only outcome reward: extract the final \\boxed{} answer and check it against the gold.

    extract_answer(text, mode="answer_tag")  # last \\boxed{} inside the last <answer>...</answer>
    is_equivalent(pred, gold)                # integer fast path, else math-verify out of process
    score(response_text, gold)               # 1.0 or 0.0

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
import os
import queue
import re
import select
import subprocess
import sys
import threading
from typing import Any, Awaitable, Callable

from rstar_jax.rewards import verify_worker

EXTRACT_MODES = ("answer_tag", "anywhere")
DEFAULT_TIMEOUT_S = 5.0
MAX_ANSWER_CHARS = 4096   # longer "answers" are not answers; refuse before parsing
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")

Runner = Callable[..., Awaitable[Any]]


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
                return text[start + 1:i]
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

    def _start(self) -> None:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
        self._proc = subprocess.Popen(
            [sys.executable, verify_worker.__file__], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1, env=env,
            start_new_session=True)
        if self._read(self._startup_timeout_s) is None:
            self.kill()
            raise RuntimeError(f"math_reward: verify worker did not start within "
                               f"{self._startup_timeout_s} s")

    def _read(self, timeout_s: float) -> dict | None:
        assert self._proc is not None and self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
        if not ready:
            return None
        line = self._proc.stdout.readline()
        return json.loads(line) if line else None

    def verify(self, pred: str, gold: str, timeout_s: float) -> bool | None:
        """True/False, or None on timeout or crash (the process is then killed)."""
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        try:
            self._proc.stdin.write(json.dumps({"pred": pred, "gold": gold}) + "\n")
            self._proc.stdin.flush()
            reply = self._read(timeout_s)
        except (BrokenPipeError, OSError, ValueError):
            reply = None
        if reply is None:
            self.kill()
            return None
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

    def __init__(self, num_workers: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S,
                 startup_timeout_s: float = 120.0):
        if num_workers < 1:
            raise ValueError(f"Verifier: num_workers must be >= 1, got {num_workers}")
        self.timeout_s = timeout_s
        self.num_timeouts = 0
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all = [_Worker(startup_timeout_s) for _ in range(num_workers)]
        for w in self._all:
            self._idle.put(w)

    def verify(self, pred: str, gold: str, timeout_s: float | None = None) -> bool:
        w = self._idle.get()
        try:
            ok = w.verify(pred, gold, self.timeout_s if timeout_s is None else timeout_s)
        finally:
            self._idle.put(w)
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


def is_equivalent(pred: str | None, gold: str, timeout_s: float = DEFAULT_TIMEOUT_S, *,
                  verifier: Verifier | None = None, max_chars: int = MAX_ANSWER_CHARS) -> bool:
    """Whether answer ``pred`` equals ``gold`` (both LaTeX answer bodies, no \\boxed).

    Integers (commas, leading zeros, signs) compare exactly in-process; everything else goes
    to math-verify (gold and pred each parsed as ``\\boxed{...}``) in a worker process,
    bounded by ``timeout_s``; a timeout is False. Answers longer than ``max_chars`` are False.
    """
    decided = _precheck(pred, gold, max_chars)
    if decided is not None:
        return decided
    return (verifier or default_verifier()).verify(pred, gold, timeout_s)


def score(response_text: str, gold: str, *, mode: str = "answer_tag",
          timeout_s: float = DEFAULT_TIMEOUT_S, verifier: Verifier | None = None) -> float:
    """1.0 if the extracted final answer is equivalent to ``gold``, else 0.0."""
    pred = extract_answer(response_text, mode)
    return 1.0 if is_equivalent(pred, gold, timeout_s, verifier=verifier) else 0.0


async def score_async(response_text: str, gold: str, runner: Runner | None = None, *,
                      mode: str = "answer_tag", timeout_s: float = DEFAULT_TIMEOUT_S,
                      verifier: Verifier | None = None) -> float:
    """`score` for asyncio code.

    With ``runner`` (e.g. ``CodePool.run_function``) math-verify runs as
    ``await runner(verify_worker.verify_strings, pred, gold, timeout_s=timeout_s)``; any
    exception the runner raises (timeout, memory limit, ...) scores 0. Without it the
    `Verifier` is used from a thread so the event loop never blocks.
    """
    pred = extract_answer(response_text, mode)
    decided = _precheck(pred, gold, MAX_ANSWER_CHARS)
    if decided is not None:
        return float(decided)
    if runner is None:
        v = verifier or default_verifier()
        ok = await asyncio.to_thread(v.verify, pred, gold, timeout_s)
        return float(ok)
    try:
        ok = await runner(verify_worker.verify_strings, pred, gold, timeout_s=timeout_s)
    except Exception:
        return 0.0
    return 1.0 if ok is True else 0.0
