"""math-verify equivalence, run out of process.

`verify_strings` is the module-level function a function runner (e.g. the code pool's
``run_function``) calls. Run as a script, this file is the persistent worker of
`rstar_jax.rewards.math_reward.Verifier`: one JSON request per stdin line
``{"pred": ..., "gold": ..., "kind": "answer" | "text"}``, one JSON reply per stdout line
``{"ok": bool}`` (kind "answer": `verify_strings`, the default; "text": `verify_text`; any
other kind is a ``"module:qualname"`` target, the registered verifier of a user's module
(`rstar_jax.rewards.registry`), imported here on first use). A target that cannot be imported
or raises replies ``{"ok": false, "error": "..."}`` and the worker goes on serving.

It imports nothing from rstar_jax (starts fast, never touches jax) and calls math-verify with
its own signal-based timeouts disabled: the parent enforces the time bound by killing the
process, and math-verify's alarms do not work outside a main thread anyway.
"""

from __future__ import annotations

import importlib
import json
import os
import sys


def _parse(math_verify, text: str):
  """Parse an answer string: as a \\boxed{} body first, then as inline math, then bare."""
  for wrapped in ("\\boxed{" + text + "}", "$" + text + "$", text):
    parsed = math_verify.parse(wrapped, parsing_timeout=None)
    if parsed:
      return parsed
  return []


def verify_strings(pred: str, gold: str) -> bool:
  """True when math-verify finds ``pred`` equivalent to ``gold`` (both answer bodies)."""
  import math_verify

  try:
    g = _parse(math_verify, gold)
    p = _parse(math_verify, pred)
    if not g or not p:
      return False
    return bool(math_verify.verify(g, p, timeout_seconds=None))
  except Exception:  # any parser/sympy failure means "not shown equal"
    return False


def verify_text(response: str, gold: str) -> bool:
  """True when math-verify, reading the whole ``response``, finds an answer equal to ``gold``.

  The released rStar2-Agent reward's second check: gold parsed as ``\\boxed{gold}`` with
  LaTeX extraction; the response searched with expression and LaTeX extraction (math-verify
  takes the last boxed / dollar-delimited / bare expression it finds).
  """
  import math_verify
  from math_verify import ExprExtractionConfig, LatexExtractionConfig

  try:
    g = math_verify.parse(
      "\\boxed{" + gold + "}", extraction_config=[LatexExtractionConfig()], parsing_timeout=None
    )
    p = math_verify.parse(
      response,
      extraction_config=[ExprExtractionConfig(), LatexExtractionConfig()],
      parsing_timeout=None,
    )
    if not g or not p:
      return False
    return bool(math_verify.verify(g, p, timeout_seconds=None))
  except Exception:  # any parser/sympy failure means "not shown equal"
    return False


_KINDS = {"answer": verify_strings, "text": verify_text}


def resolve(target: str, root: str | None = None):
  """The function a kind names: a built-in kind, or ``"module:qualname"`` imported (from
  ``root`` first when given: the folder the parent imported the module from)."""
  if target in _KINDS:
    return _KINDS[target]
  module, sep, qualname = target.partition(":")
  if not sep or not module or not qualname:
    raise ValueError(f"verifier target: expected 'module:qualname', got {target!r}")
  if root and root not in sys.path:
    sys.path.insert(0, root)
  obj = importlib.import_module(module)
  for part in qualname.split("."):
    obj = getattr(obj, part)
  return obj


def _answer(fn, pred: str, gold: str) -> dict:
  try:
    return {"ok": bool(fn(pred, gold))}
  except Exception as e:  # the user's verifier failed on this pair: not shown equal
    return {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}


def _serve() -> None:
  out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
  sys.stdout = sys.stderr  # stray prints from libraries must not corrupt the protocol
  import math_verify  # noqa: F401  (warm the import before saying ready)

  verify_strings("1", "1")
  out.write(json.dumps({"ready": True}) + "\n")
  fns: dict = {}
  for line in sys.stdin:
    req = json.loads(line)
    kind = req.get("kind", "answer")
    try:
      fn = fns[kind] if kind in fns else fns.setdefault(kind, resolve(kind, req.get("root")))
    except Exception as e:
      reply = {"ok": False, "error": f"cannot load verifier {kind!r}: {type(e).__name__}: {e}"}
    else:
      reply = _answer(fn, req["pred"], req["gold"])
    out.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
  _serve()
