"""Rewards and verifiers selected by name from the config (``reward.name``, ``reward.verifier``).

Two kinds, each its own table:

    verifier  fn(pred: str, gold: str) -> bool      runs OUT OF PROCESS in the math-verify
                                                    worker (`verify_worker.py`), killed after
                                                    ``reward.timeout_s`` (a timeout scores 0)
    reward    fn(response_text, gold, ctx) -> float runs in the rollout process (sync, called
                                                    in a thread, or async); `RewardContext.verify`
                                                    asks the configured verifier out of process

Built-ins: verifiers ``math_verify`` (answer bodies, integer fast path first) and
``math_verify_text`` (the whole response searched by math-verify); rewards ``math`` (the
answer extracted per ``rl.answer_mode``, judged by ``reward.verifier``) and ``released`` (the
released rStar2-Agent reward, `math_reward.score(mode="released")`, which judges with
math-verify itself).

A user's module registers its own and the config names the module, so it works from the
launchers (``--config.reward.imports=my_verifiers --config.reward.verifier=near``)::

    from rstar_jax.rewards import registry

    @registry.register_verifier("near")
    def near(pred: str, gold: str) -> bool:
        return abs(float(pred) - float(gold)) < 1e-6

A verifier must be a module-level function of an importable module (the worker imports it by
``module:qualname``); an exception inside it scores 0 and is logged. Re-registering the same
function (module reload) replaces it silently; a different function under a taken name raises
``ValueError`` unless ``override=True`` (as `rstar_jax.rl.registry`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from rstar_jax.rewards import math_reward
from rstar_jax.user_modules import import_user_modules

VERIFIER, REWARD = "verifier", "reward"
_TABLES: dict[str, dict[str, Callable]] = {VERIFIER: {}, REWARD: {}}
_TARGETS: dict[str, str] = {}  # verifier name -> "module:qualname" the worker imports
_ROOTS: dict[str, str | None] = {}  # verifier name -> the folder its module imports from


def _import_root(module: str) -> str | None:
  """The sys.path folder ``module`` was imported from (``/x`` for ``a.b`` in ``/x/a/b.py``)."""
  path = getattr(sys.modules.get(module), "__file__", None)
  if not path:
    return None
  levels = module.count(".") + (os.path.basename(path) == "__init__.py")
  root = os.path.dirname(os.path.abspath(path))
  for _ in range(levels):
    root = os.path.dirname(root)
  return root


def _key(fn: Callable) -> tuple:
  return getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)


def _register(kind: str, name: str, fn: Callable, override: bool) -> None:
  if not isinstance(name, str) or not name:
    raise ValueError(f"rewards.registry: a {kind} name must be a non-empty string, got {name!r}")
  table = _TABLES[kind]
  old = table.get(name)
  same = old is not None and (old is fn or (_key(old) == _key(fn) and _key(fn)[1] is not None))
  if old is not None and not same and not override:
    raise ValueError(
      f"rewards.registry: {kind} {name!r} is already registered to {old!r}; "
      "pass override=True to replace it"
    )
  table[name] = fn


def register_verifier(name: str, *, override: bool = False) -> Callable[[Callable], Callable]:
  """Decorator registering ``fn(pred, gold) -> bool`` as verifier ``name`` (module docstring)."""

  def deco(fn: Callable) -> Callable:
    module, qualname = _key(fn)
    if not module or module == "__main__" or not qualname or "<" in qualname:
      raise ValueError(
        f"rewards.registry: verifier {name!r} must be a module-level function of an importable "
        f"module (it runs in a worker process that imports it), got {module}:{qualname}"
      )
    _register(VERIFIER, name, fn, override)
    _TARGETS[name] = f"{module}:{qualname}"
    _ROOTS[name] = _import_root(module)
    return fn

  return deco


def register_reward(name: str, *, override: bool = False) -> Callable[[Callable], Callable]:
  """Decorator registering ``fn(response_text, gold, ctx) -> float`` (sync or async)."""

  def deco(fn: Callable) -> Callable:
    _register(REWARD, name, fn, override)
    return fn

  return deco


def names(kind: str) -> list[str]:
  """Registered names of ``kind`` ("reward" | "verifier"), built-ins first."""
  return list(_TABLES[kind])


def get(kind: str, name: str) -> Callable:
  """The function registered as (kind, name); a one-line KeyError lists the known names."""
  if name not in _TABLES[kind]:
    raise KeyError(f"rewards.registry: no {kind} named {name!r}; known: {names(kind)}")
  return _TABLES[kind][name]


def verifier_target(name: str) -> str:
  """The worker's kind for verifier ``name``: a built-in kind or ``"module:qualname"``."""
  get(VERIFIER, name)
  return _TARGETS[name]


@dataclasses.dataclass(frozen=True)
class RewardContext:
  """What a reward function may use besides the response and the gold answer.

  Attributes:
    verifier: name of the configured verifier (``reward.verifier``).
    timeout_s: bound on each out-of-process verifier call.
    answer_mode: ``rl.answer_mode`` (the built-in ``math`` reward's extraction rule).
    pool: the `math_reward.Verifier` worker pool (None = the process-wide one).
  """

  verifier: str = "math_verify"
  timeout_s: float = math_reward.DEFAULT_TIMEOUT_S
  answer_mode: str = "answer_tag"
  pool: math_reward.Verifier | None = None

  def verify(self, pred: str | None, gold: str) -> bool:
    """Whether the configured verifier finds answer ``pred`` equal to ``gold`` (out of
    process, bounded by ``timeout_s``; a timeout or an exception is False). Missing or
    oversized answers are False without asking."""
    if self.verifier == "math_verify":  # the integer / exact-text fast path first
      return math_reward.is_equivalent(pred, gold, self.timeout_s, verifier=self.pool)
    if pred is None or not pred.strip() or len(pred) > math_reward.MAX_ANSWER_CHARS:
      return False
    pool = self.pool or math_reward.default_verifier()
    target = verifier_target(self.verifier)
    return pool.verify(pred, gold, self.timeout_s, kind=target, root=_ROOTS.get(self.verifier))


# ----------------------------------------------------------------------------- built-ins
_TABLES[VERIFIER]["math_verify"] = math_reward.verify_worker.verify_strings
_TARGETS["math_verify"] = "answer"
_TABLES[VERIFIER]["math_verify_text"] = math_reward.verify_worker.verify_text
_TARGETS["math_verify_text"] = "text"


@register_reward("math")
async def math_answer(response_text: str, gold: str, ctx: RewardContext) -> float:
  """1.0 when the answer extracted per ``ctx.answer_mode`` satisfies ``ctx.verifier``."""
  if ctx.verifier == "math_verify":  # the unchanged path of `math_reward.score_async`
    return await math_reward.score_async(
      response_text, gold, mode=ctx.answer_mode, timeout_s=ctx.timeout_s, verifier=ctx.pool
    )
  if ctx.answer_mode == "released":
    _, pred = math_reward.extract_released(math_reward.released_text(response_text))
  else:
    pred = math_reward.extract_answer(response_text, ctx.answer_mode)
  return 1.0 if await asyncio.to_thread(ctx.verify, pred, gold) else 0.0


@register_reward("released")
async def released_reward(response_text: str, gold: str, ctx: RewardContext) -> float:
  """The released rStar2-Agent reward (`math_reward.score`, mode "released")."""
  return await math_reward.score_async(
    response_text, gold, mode="released", timeout_s=ctx.timeout_s, verifier=ctx.pool
  )


def scorer(name: str, ctx: RewardContext) -> Callable[[str, str], Any]:
  """``async score(response_text, gold) -> float`` for reward ``name``: an async reward is
  awaited, a sync one runs in a thread (a slow reward never blocks the event loop)."""
  fn = get(REWARD, name)

  if inspect.iscoroutinefunction(fn):

    async def score(response_text: str, gold: str) -> float:
      return float(await fn(response_text, gold, ctx))

  else:

    async def score(response_text: str, gold: str) -> float:
      return float(await asyncio.to_thread(fn, response_text, gold, ctx))

  return score


def from_config(run) -> Callable[[str, str], Any]:
  """The scorer a `RunConfig` selects: imports ``reward.imports``, then ``reward.name`` with
  ``reward.verifier``, ``reward.timeout_s`` and ``rl.answer_mode``."""

  r = run.reward
  import_user_modules(r.imports, field="reward.imports")
  ctx = RewardContext(verifier=r.verifier, timeout_s=r.timeout_s, answer_mode=run.rl.answer_mode)
  return scorer(r.name, ctx)
